"""Read checkpoint files without running anything of them.

A ``.pth`` file is a pickle, and unpickling can call any function the file
names. Every checkpoint the plugin reads goes through
:func:`load_checkpoint`: mmengine's loaders of every scheme as the plugin
registers them (:mod:`mmseg_mita.checkpoint_schemes`: ``load_from``,
``--resume``, ``tools/test.py``, ``init_cfg=dict(type='Pretrained')``, the
tools that build models from checkpoints; local files, URLs, model zoos,
file backends) and the converters
(:func:`mmseg_mita.converters.read_checkpoint`). It tells the format by
content (:mod:`.formats`) and

* loads PyTorch files with ``torch.load(weights_only=True)``: torch's own
  restricted unpickler, which admits tensors, storages, plain containers,
  ``torch.Size``/dtype/device values, and restricts BUILD, persistent ids
  and the legacy format itself. What mmengine's runner checkpoints and DeiT
  checkpoints hold besides (numpy arrays, mmengine's ``HistoryBuffer``,
  ``getattr`` for its statistics methods and ``OneCycleLR``'s annealing
  functions, ``argparse.Namespace``) is admitted for the duration of the
  load only, through validating builders (:mod:`.allowed`); nothing of
  torch, numpy, mmengine or argparse is changed by a load;
* before that, checks what torch does not (:mod:`.archive`, :mod:`.scan`):
  torch's zip reader and Python's ``zipfile`` see the same members (CRC-32
  checked; no TorchScript archive, which ``torch.load`` hands to
  ``torch.jit.load``), every global is admitted (torch's defaults minus the
  constructors that allocate memory from a number in the file), every
  tensor's storage is in the file, and no tensor has more elements than
  its storage holds;
* drops, with a warning, a config text the checkpoint holds that is not
  assignments of plain values (:mod:`.config_text`: mmengine runs it as
  Python on resume);
* reads safetensors and ``.npz`` without pickle, each array checked to hold
  what its header claims; refuses torch's ``.tar`` format.

A refused file raises :class:`UnsafeCheckpointError` naming what it does, a
damaged one :class:`CorruptCheckpointError` (both ``ValueError``). A
trusted file that is refused loads with full unpickling only when the
environment variable ``MMSEG_MITA_UNSAFE_LOAD=1`` is set. Importing this
package changes nothing in torch (no safe globals are added), numpy or
mmengine.
"""
from .errors import (UNSAFE_ENV, CorruptCheckpointError,
                     UnsafeCheckpointError, unsafe_load_allowed)
from .formats import NpzWeights
from .loader import load_checkpoint

__all__ = [
    'UNSAFE_ENV', 'CorruptCheckpointError', 'NpzWeights',
    'UnsafeCheckpointError', 'load_checkpoint', 'unsafe_load_allowed'
]
