"""Workarounds for defects of the mmsegmentation 1.2.2 stack.

Applied once when :mod:`mmseg_mita` is imported (configs import it through
``custom_imports``), so users of mmseg's own tools never see them.

* torch >= 2.6 defaults ``torch.load`` to ``weights_only=True``. mmengine
  0.10.7 calls it without the argument, and its own checkpoints pickle the
  message hub (``HistoryBuffer`` objects with numpy arrays and bound
  methods, reached through ``getattr``), so ``tools/test.py``, ``--resume``
  and ``load_from`` refuse every checkpoint mmengine wrote. Local checkpoint
  files are loaded as mmengine was written to load them (full unpickling,
  torch's behaviour before 2.6): as before, load only checkpoints you trust.
"""
import os.path as osp

import torch
from mmengine.runner.checkpoint import CheckpointLoader


def load_local_checkpoint(filename, map_location=None):
    """mmengine's local-file checkpoint loader, with the pre-2.6 default."""
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return torch.load(filename, map_location=map_location, weights_only=False)


def allow_mmengine_checkpoints() -> None:
    CheckpointLoader.register_scheme(
        prefixes='', loader=load_local_checkpoint, force=True)


def apply() -> None:
    allow_mmengine_checkpoints()
