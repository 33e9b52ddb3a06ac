"""Without a GPU, the Triton kernels run in Triton's CPU interpreter.

``TRITON_INTERPRET=1`` only takes effect if it is set before triton is first
imported (triton's own ``tl.zeros``, ``tl.sum``... are compiled-mode
functions otherwise), so it is set here, before any test module of this
directory is collected. With CUDA the kernels are compiled and the CUDA
tests run them (``test_cuda_backends.py``).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')
