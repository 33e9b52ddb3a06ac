"""Without a GPU, the Triton kernels run in Triton's CPU interpreter.

``TRITON_INTERPRET=1`` only takes effect if it is set before triton is first
imported (triton's own ``tl.zeros``, ``tl.sum``... are compiled-mode
functions otherwise), so it is set here, before any test module of this
directory is collected. With CUDA the kernels are compiled and the CUDA
tests run them (``test_cuda_backends.py``).
"""
import os
import sys
import types

import pytest
import torch
from mita_testing import plain_varlen_attention

if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')


@pytest.fixture
def plain_flash(monkeypatch):
    """flash-attn replaced by its contract in plain PyTorch
    (:func:`mita_testing.plain_varlen_attention`, which computes without
    dropout); returns the ``dropout_p`` of every call, as received."""
    received = []

    def varlen_attention(*args, dropout_p=0.0, **kwargs):
        received.append(dropout_p)
        return plain_varlen_attention(*args, **kwargs)

    fake = types.ModuleType('flash_attn')
    fake.flash_attn_varlen_func = varlen_attention
    monkeypatch.setitem(sys.modules, 'flash_attn', fake)
    return received
