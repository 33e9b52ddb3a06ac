"""Without a GPU, the Triton kernels run in Triton's CPU interpreter.

``TRITON_INTERPRET=1`` only takes effect if it is set before triton is first
imported (triton's own ``tl.zeros``, ``tl.sum``... are compiled-mode
functions otherwise), so it is set here, before any test module of this
directory is collected. With CUDA the kernels are compiled and the CUDA
tests run them (``test_cuda_backends.py``).
"""
import dataclasses
import os
import sys
import types

import pytest
import torch
from mita_testing import plain_varlen_attention

from mmseg_mita.ops import REGISTRY
from mmseg_mita.ops.declaration import ALL_DTYPES

if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')


@pytest.fixture
def plain_flash(monkeypatch):
    """flash-attn replaced by its contract in plain PyTorch
    (:func:`mita_testing.plain_varlen_attention`, which computes without
    dropout, in any dtype on any device: the flash backend's declaration
    says so while the fixture is in use); returns the ``dropout_p`` of
    every call, as received."""
    received = []

    def varlen_attention(*args, dropout_p=0.0, **kwargs):
        received.append(dropout_p)
        return plain_varlen_attention(*args, **kwargs)

    fake = types.ModuleType('flash_attn')
    fake.flash_attn_varlen_func = varlen_attention
    monkeypatch.setitem(sys.modules, 'flash_attn', fake)
    monkeypatch.setitem(
        REGISTRY, 'flash',
        dataclasses.replace(REGISTRY['flash'], devices=('cpu', 'cuda'),
                            dtypes=ALL_DTYPES, requires=()))
    return received
