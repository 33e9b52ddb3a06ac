"""Unpickle PyTorch checkpoint files through an allow-list.

A ``.pth`` file is a pickle, and unpickling can call any function the file
names. Every checkpoint the plugin reads goes through :func:`torch_load`:
mmengine's local-file loader as the plugin registers it
(:mod:`mmseg_mita.mmseg_plugin`: ``load_from``, ``--resume``,
``tools/test.py``, ``init_cfg=dict(type='Pretrained')``, the tools that build
models from checkpoints) and the converters
(:func:`mmseg_mita.converters.read_checkpoint`). It hands ``torch.load`` a
restricted unpickler (the pattern of the ``pickle`` documentation,
"Restricting Globals") whose ``find_class`` admits only:

* tensors and storages (torch's rebuild functions; storages are resolved by
  ``torch.load`` itself), ``collections.OrderedDict``, ``set``,
  ``frozenset``, ``bytearray``, ``complex`` and ``_codecs.encode`` (bytes in
  pickle protocol 2); numbers, strings, lists, tuples and dicts need no
  global;
* what mmengine's runner checkpoints hold besides: its message hub's
  ``HistoryBuffer`` objects, numpy arrays, dtypes and scalars, and the
  buffers' statistics methods, pickled as ``getattr(HistoryBuffer, 'min')``:
  ``getattr`` is admitted for exactly that, the ``HistoryBuffer`` class (or
  one of its objects) and the names in :data:`HISTORY_BUFFER_METHODS`;
* ``argparse.Namespace`` (the ``args`` of DeiT and MiTA-DeiT checkpoints).

Anything else stops the unpickling at the first global outside the list,
before it is called, with a ``ValueError`` (:class:`UnsafeCheckpointError`)
naming the file and the global. TorchScript archives, which ``torch.load``
would hand to ``torch.jit.load``, are refused too. A trusted file the list
refuses loads with full unpickling only when the environment variable
``MMSEG_MITA_UNSAFE_LOAD=1`` is set. safetensors and ``.npz`` files are
read without pickle (:mod:`mmseg_mita.converters.loading`).

Importing this module changes nothing in torch (no safe globals are added)
or mmengine.
"""
import _compat_pickle
import importlib
import os
import pickle
import types
import warnings
import zipfile
from typing import Any, Dict, FrozenSet

import torch

UNSAFE_ENV = 'MMSEG_MITA_UNSAFE_LOAD'
HISTORY_BUFFER = ('mmengine.logging.history_buffer', 'HistoryBuffer')
HISTORY_BUFFER_METHODS = frozenset({'min', 'max', 'current', 'mean'})
_NUMPY_MULTIARRAY = frozenset({'_reconstruct', 'scalar'})
ALLOWED_GLOBALS: Dict[str, FrozenSet[str]] = {
    'torch._utils': frozenset({
        '_rebuild_tensor', '_rebuild_tensor_v2', '_rebuild_tensor_v3',
        '_rebuild_parameter', '_rebuild_parameter_with_state'
    }),
    'collections': frozenset({'OrderedDict'}),
    'builtins': frozenset({'set', 'frozenset', 'bytearray', 'complex'}),
    '_codecs': frozenset({'encode'}),
    'numpy': frozenset({'ndarray', 'dtype'}),
    'numpy.core.multiarray': _NUMPY_MULTIARRAY,
    'numpy._core.multiarray': _NUMPY_MULTIARRAY,  # written by numpy >= 2
    HISTORY_BUFFER[0]: frozenset({HISTORY_BUFFER[1]}),
    'argparse': frozenset({'Namespace'}),
}


class UnsafeCheckpointError(ValueError):
    """A checkpoint names a global outside the allow-list."""


class _Refused(Exception):
    """Raised inside the unpickler; :func:`torch_load` adds the file."""


def _history_buffer_method(obj: Any, name: str) -> Any:
    """``getattr`` as the allow-list admits it: a statistics method of
    mmengine's ``HistoryBuffer``, nothing else."""
    buffer = getattr(importlib.import_module(HISTORY_BUFFER[0]),
                     HISTORY_BUFFER[1])
    if (obj is buffer or type(obj) is buffer) and \
            name in HISTORY_BUFFER_METHODS:
        return getattr(obj, name)
    what = obj.__qualname__ if isinstance(obj, type) else \
        f'a {type(obj).__qualname__} object'
    raise _Refused(f'builtins.getattr({what}, {name!r})')


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` resolving only :data:`ALLOWED_GLOBALS`."""

    def find_class(self, module: str, name: str) -> Any:
        # protocol-2 pickles (torch.save's) spell Python 2 names
        module, name = _compat_pickle.NAME_MAPPING.get(
            (module, name), (_compat_pickle.IMPORT_MAPPING.get(
                module, module), name))
        if module == 'builtins' and name == 'getattr':
            return _history_buffer_method
        if name not in ALLOWED_GLOBALS.get(module, ()):
            raise _Refused(f'{module}.{name}')
        return getattr(importlib.import_module(module), name)


def _restricted_load(file, **kwargs) -> Any:
    return RestrictedUnpickler(file, **kwargs).load()


# what torch.load needs of a pickle_module
RESTRICTED_PICKLE = types.SimpleNamespace(
    __name__=__name__, Unpickler=RestrictedUnpickler, load=_restricted_load)


def unsafe_load_allowed() -> bool:
    """The user opted in to full unpickling (``MMSEG_MITA_UNSAFE_LOAD=1``)."""
    return os.environ.get(UNSAFE_ENV) == '1'


def _how_to_proceed(path: str) -> str:
    return (f'If you trust {path}, set the environment variable '
            f'{UNSAFE_ENV}=1 to load it with full unpickling (e.g. '
            f'`{UNSAFE_ENV}=1 python tools/test.py ...`), or load it once '
            'where you trust it and save its tensors alone '
            "(`torch.save({'state_dict': ...})` or safetensors).")


def _is_torchscript(path: str) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(n.endswith('/constants.pkl') for n in archive.namelist())


def torch_load(path: str, map_location=None) -> Any:
    """``torch.load(path)`` unpickling only the allow-list (see the module
    docstring); with ``MMSEG_MITA_UNSAFE_LOAD=1``, everything."""
    if unsafe_load_allowed():
        warnings.warn(f'{UNSAFE_ENV}=1: loading {path} with full unpickling '
                      '(it can run any code)')
        return torch.load(path, map_location=map_location, weights_only=False)
    if _is_torchscript(path):
        raise UnsafeCheckpointError(
            f'{path} is a TorchScript archive, not a checkpoint: load it with '
            'torch.jit.load. ' + _how_to_proceed(path))
    try:
        return torch.load(path, map_location=map_location, weights_only=False,
                          pickle_module=RESTRICTED_PICKLE)
    except _Refused as refused:
        raise UnsafeCheckpointError(
            f'refused to load checkpoint {path}: unpickling it calls '
            f'{refused}, which is not on the allow-list of mmseg_mita '
            '(tensors, plain containers, numbers, strings, and what '
            'mmengine, timm, DeiT, mmpretrain and mmseg checkpoints hold: '
            'mmseg_mita/safe_load.py). Nothing of the file was run. ' +
            _how_to_proceed(path)) from None
