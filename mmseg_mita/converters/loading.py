"""Read the checkpoint files the converters take, their format told by
content (:func:`mmseg_mita.safe_load.load_checkpoint`): PyTorch files
(``.pth``, ``.bin``, ``.pt``: DeiT training checkpoints hold their
``argparse.Namespace`` of arguments, admitted; anything that would run code
is refused before it runs), safetensors, and NumPy ``.npz`` (Google AugReg /
big_vision weights, returned as :class:`NpzWeights`).
"""
from typing import Any

from mmseg_mita.safe_load import NpzWeights, load_checkpoint

__all__ = ['NpzWeights', 'read_checkpoint']


def read_checkpoint(path: str) -> Any:
    """The content of a checkpoint file: :class:`NpzWeights` for ``.npz``,
    a tensor dict for safetensors, else what ``torch.load`` returns (on the
    CPU)."""
    return load_checkpoint(path, map_location='cpu')
