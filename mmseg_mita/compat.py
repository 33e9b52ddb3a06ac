"""Workarounds for defects of the mmsegmentation 1.2.2 stack.

Applied once when :mod:`mmseg_mita` is imported, so users of mmseg's own
tools never see them:

* torch >= 2.6 loads checkpoints with ``weights_only=True``; mmengine 0.10.7
  calls ``torch.load`` without the argument and its own checkpoints (message
  hub ``HistoryBuffer`` with numpy arrays and scalars) are refused by
  ``tools/test.py``, ``--resume`` and ``load_from``. We allow exactly those
  types in torch's safe-unpickling list instead of turning the check off.
"""
import numpy as np
import torch


def _numpy_checkpoint_globals():
    core = getattr(np, '_core', None) or np.core
    multiarray = core.multiarray
    dtypes = [np.float64, np.float32, np.float16, np.int64, np.int32,
              np.int16, np.int8, np.uint8, np.bool_]
    return [multiarray._reconstruct, multiarray.scalar, np.ndarray,
            np.dtype] + [type(np.dtype(t)) for t in dtypes]


def allow_mmengine_checkpoints() -> None:
    """Let ``torch.load(weights_only=True)`` read mmengine checkpoints."""
    add_safe_globals = getattr(torch.serialization, 'add_safe_globals', None)
    if add_safe_globals is None:  # torch < 2.4 does not restrict loading
        return
    from mmengine.logging import HistoryBuffer
    add_safe_globals([HistoryBuffer] + _numpy_checkpoint_globals())


def apply() -> None:
    allow_mmengine_checkpoints()
