"""The one function that reads a checkpoint file: :func:`load_checkpoint`."""
import os
import pickle
import warnings
from typing import Any, BinaryIO, Optional

import torch

from .allowed import admitted, resolve
from .archive import ZipView, python_view, torch_reader
from .config_text import drop_code_texts
from .errors import (UNSAFE_ENV, Damaged, Refused, damaged, refused,
                     unsafe_load_allowed)
from .formats import is_npz, read_npz, read_safetensors, sniff
from .scan import scan_legacy, scan_zip

NPZ_REFUSED = (
    'it is a NumPy .npz (AugReg / big_vision weights), which mmengine '
    'cannot load into a model: convert it first, `python '
    'tools/convert_vit.py {path} OUT.pth`, and load OUT.pth')


def load_checkpoint(path: str, map_location: Any = None, npz: bool = True,
                    name: Optional[str] = None) -> Any:
    """The content of the checkpoint file at ``path``, its format told by
    content: what ``torch.load`` returns for PyTorch files (zip or legacy;
    through :func:`load_torch_file`), a tensor dict for safetensors (moved
    to ``map_location``: a device), the arrays of an ``.npz``
    (:class:`.formats.NpzWeights`; refused unless ``npz``). A config text
    the checkpoint stores that is not data is dropped with a warning
    (:mod:`.config_text`: mmengine runs it). ``name``: what
    the messages call the file (default ``path``; the URL it was fetched
    from, say).

    Raises :class:`.UnsafeCheckpointError` for a file it refuses,
    :class:`.CorruptCheckpointError` for a damaged one (ValueErrors both)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f'no checkpoint file at {path}')
    size = os.path.getsize(path)
    with open(path, 'rb') as file:
        try:
            kind = sniff(file, size)
            if kind == 'safetensors':
                return _to_device(read_safetensors(file, size), map_location)
            view = python_view(file, size) if kind == 'zip' else None
            if view is not None and is_npz(view.infos):
                if not npz:
                    raise Refused(NPZ_REFUSED.format(path=path))
                return read_npz(file, view.infos)
            loaded = load_torch_file(file, kind, view, map_location)
            if not unsafe_load_allowed():
                drop_code_texts(loaded, name or path)
            return loaded
        except Refused as e:
            raise refused(name or path, str(e)) from None
        except Damaged as e:
            raise damaged(name or path, size, str(e)) from None


def _to_device(tensors: dict, map_location: Any) -> dict:
    if map_location is None:
        return tensors
    if not isinstance(map_location, (str, torch.device)):
        raise ValueError(
            f'map_location={map_location!r}: a safetensors file is loaded '
            'onto a device given as a string or torch.device')
    return {k: v.to(map_location) for k, v in tensors.items()}


def load_torch_file(file: BinaryIO, kind: str,
                    view: Optional[ZipView] = None,
                    map_location: Any = None) -> Any:
    """``torch.load`` of a PyTorch file (``kind``: ``'zip'``, with ``view``
    from :func:`.archive.python_view`, ``'legacy'`` or ``'tar'``) on torch's
    weights-only unpickler, with :mod:`.allowed` admitted for the duration,
    after :mod:`.archive` and :mod:`.scan` checked the file (read from the
    one open ``file``, never mapped: torch's ``mmap`` would read it after
    the checks); with ``MMSEG_MITA_UNSAFE_LOAD=1``, full unpickling."""
    if unsafe_load_allowed():
        warnings.warn(f'{UNSAFE_ENV}=1: loading {file.name} with full '
                      'unpickling (it can run any code)')
        file.seek(0)
        return torch.load(file, map_location=map_location, weights_only=False)
    if kind == 'tar':
        raise Refused("it is in torch's oldest format (a .tar archive), "
                      'whose loader extracts members to disk')
    size = os.fstat(file.fileno()).st_size
    try:
        if kind == 'zip':
            scan_zip(torch_reader(file, view, size))
        else:
            file.seek(0)
            scan_legacy(file, size)
    except (Refused, Damaged):
        raise
    except Exception as e:  # a malformed pickle: errors of all kinds
        raise Damaged(f'{type(e).__name__}: {str(e)[:300]}') from e
    file.seek(0)
    try:
        with admitted():
            loaded = torch.load(file, map_location=map_location,
                                weights_only=True, mmap=False)
    except pickle.UnpicklingError as e:
        reason = str(e).split('WeightsUnpickler error: ')[-1]
        raise Refused("torch's weights-only unpickler refused it: " +
                      reason.split('\n\nCheck the documentation')[0].strip())
    return resolve(loaded)
