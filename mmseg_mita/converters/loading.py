"""Read checkpoint files, telling their container format by content.

* NumPy ``.npz`` (a zip archive of ``.npy`` members): Google AugReg /
  big_vision weights, returned as :class:`NpzWeights`;
* safetensors (8-byte little-endian header length, then a JSON header):
  returned as a flat ``{name: Tensor}`` dict;
* anything else (``.pth``, ``.bin``, ``.pt``) is unpickled by
  :func:`mmseg_mita.safe_load.torch_load`, through the allow-list that
  mmengine's loader uses too (DeiT training checkpoints hold their
  ``argparse.Namespace`` of arguments, admitted; a file naming any other
  global is refused before it runs).

Zip archives (``.npz`` and torch's format) are checked first: ``torch.load``
does not verify the CRC-32 of its members, so a flipped bit would otherwise
load as a wrong weight.
"""
import json
import os
import struct
import zipfile
import zlib
from typing import Any, Dict, Optional

import numpy as np
import torch

from mmseg_mita.safe_load import UnsafeCheckpointError, torch_load

SAFETENSORS_DTYPES = {
    'F64': torch.float64, 'F32': torch.float32, 'F16': torch.float16,
    'BF16': torch.bfloat16, 'I64': torch.int64, 'I32': torch.int32,
    'I16': torch.int16, 'I8': torch.int8, 'U8': torch.uint8,
    'BOOL': torch.bool
}


class NpzWeights(dict):
    """``{name: np.ndarray}`` read from a NumPy ``.npz`` archive."""


def is_zip(path: str) -> bool:
    """The file starts as a zip archive (torch's format since 1.6, .npz)."""
    with open(path, 'rb') as f:
        return f.read(4) == b'PK\x03\x04'


def zip_damage(path: str) -> Optional[str]:
    """Why the zip archive at ``path`` is damaged (unreadable directory, a
    member failing its CRC-32 check), or None if it is intact or no zip."""
    if not is_zip(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
        # OSError: offsets of the directory pointing outside the file
        # (bytes lost or added), so that zipfile seeks before its start
        return f'{type(e).__name__}: {e}'
    return None if bad is None else f'member {bad} fails its CRC-32 check'


def _is_npz(path: str) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    return bool(names) and all(n.endswith('.npy') for n in names)


def _safetensors_header(path: str):
    """The parsed header of a safetensors file, or None if it is not one."""
    size = os.path.getsize(path)
    with open(path, 'rb') as f:
        head = f.read(9)
        if len(head) < 9 or head[8:9] != b'{':
            return None
        (length, ) = struct.unpack('<Q', head[:8])
        if 8 + length > size:
            return None
        f.seek(8)
        try:
            return json.loads(f.read(length)), 8 + length
        except ValueError:
            return None


def read_safetensors(path: str) -> Dict[str, torch.Tensor]:
    """All tensors of a safetensors file (format: header length u64 LE,
    JSON header ``{name: {dtype, shape, data_offsets}}``, raw bytes)."""
    header, start = _safetensors_header(path)
    header.pop('__metadata__', None)
    with open(path, 'rb') as f:
        f.seek(start)
        data = f.read()
    out = {}
    for name, info in header.items():
        if info['dtype'] not in SAFETENSORS_DTYPES:
            raise ValueError(f'{path}: tensor {name!r} has dtype '
                             f'{info["dtype"]}, which this reader does not '
                             f'handle (known: {sorted(SAFETENSORS_DTYPES)})')
        begin, end = info['data_offsets']
        buf = bytearray(data[begin:end])
        dtype = SAFETENSORS_DTYPES[info['dtype']]
        tensor = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(
            0, dtype=dtype)
        out[name] = tensor.reshape(info['shape'])
    return out


def read_checkpoint(path: str) -> Any:
    """The content of a checkpoint file: :class:`NpzWeights` for ``.npz``,
    a tensor dict for safetensors, else what ``torch.load`` returns."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f'no checkpoint file at {path}')
    damage = zip_damage(path)
    if damage is not None:
        raise ValueError(f'{path} is corrupt or truncated ({damage}): '
                         'download, copy or save it again')
    if _is_npz(path):
        with np.load(path, allow_pickle=False) as npz:
            return NpzWeights({k: npz[k] for k in npz.files})
    if _safetensors_header(path) is not None:
        return read_safetensors(path)
    try:
        return torch_load(path, map_location='cpu')
    except UnsafeCheckpointError:
        raise
    except Exception as err:  # torch raises many types for foreign files
        raise ValueError(
            f'{path} is not a checkpoint this converter reads: expected a '
            'PyTorch file (.pth/.bin/.pt), a safetensors file, or a NumPy '
            f'.npz of AugReg/big_vision weights; torch.load said: {err}'
        ) from err
