"""Fixtures of the operator tests. Without a GPU the Triton kernels run
in Triton's CPU interpreter: ``tests/conftest.py`` sets
``TRITON_INTERPRET=1`` before any test module is collected."""
import dataclasses
import sys
import types

import pytest
from mita_testing import plain_varlen_attention

from mmseg_mita.ops import REGISTRY
from mmseg_mita.ops.declaration import ALL_DTYPES


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
