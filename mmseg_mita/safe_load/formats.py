"""Checkpoint formats told by content, and the two read without pickle.

* a zip archive: torch's format since 1.6, or a NumPy ``.npz`` (every member
  an ``.npy``: Google AugReg / big_vision weights);
* safetensors: an 8-byte little-endian header length, then a JSON header
  ``{name: {dtype, shape, data_offsets}}``, then the raw bytes;
* a tar archive: torch's oldest format, refused (:mod:`.loader`);
* anything else: torch's legacy format, a sequence of pickles.
"""
import json
import struct
import tarfile
import zipfile
from typing import BinaryIO, Dict, List, Optional, Tuple

import numpy as np
import torch

from .archive import is_zip
from .errors import Damaged, Refused, brief

SAFETENSORS_DTYPES = {
    'F64': torch.float64, 'F32': torch.float32, 'F16': torch.float16,
    'BF16': torch.bfloat16, 'F8_E4M3': torch.float8_e4m3fn,
    'F8_E5M2': torch.float8_e5m2, 'I64': torch.int64, 'I32': torch.int32,
    'I16': torch.int16, 'I8': torch.int8, 'U64': torch.uint64,
    'U32': torch.uint32, 'U16': torch.uint16, 'U8': torch.uint8,
    'BOOL': torch.bool
}
NPY_KINDS = 'biufc'  # bool, int, uint, float, complex


class NpzWeights(dict):
    """``{name: np.ndarray}`` read from a NumPy ``.npz`` archive."""


def _safetensors_header(file: BinaryIO,
                        size: int) -> Optional[Tuple[dict, int]]:
    """The parsed header of a safetensors file and where its data starts,
    or None if it is not one."""
    file.seek(0)
    head = file.read(9)
    if len(head) < 9 or head[8:9] != b'{':
        return None
    (length, ) = struct.unpack('<Q', head[:8])
    if 8 + length > size:
        return None
    file.seek(8)
    try:
        header = json.loads(file.read(length))
    except ValueError:
        return None
    return (header, 8 + length) if type(header) is dict else None


def _is_tar(file: BinaryIO) -> bool:
    """``torch.load``'s own test: ``tarfile`` opens it (reading headers
    only)."""
    file.seek(0)
    try:
        tarfile.open(fileobj=file, mode='r:', format=tarfile.PAX_FORMAT)
    except tarfile.TarError:
        return False
    return True


def sniff(file: BinaryIO, size: int) -> str:
    """``'zip'``, ``'safetensors'``, ``'tar'`` or ``'legacy'`` (torch's
    pickles; anything not recognised ends up there)."""
    if is_zip(file):
        return 'zip'
    if _safetensors_header(file, size) is not None:
        return 'safetensors'
    return 'tar' if _is_tar(file) else 'legacy'


def is_npz(infos: List[zipfile.ZipInfo]) -> bool:
    return bool(infos) and all(i.filename.endswith('.npy') for i in infos)


def _count(shape) -> int:
    count = 1
    for n in shape:
        count *= n
    return count


def read_safetensors(file: BinaryIO, size: int) -> Dict[str, torch.Tensor]:
    """All tensors of a safetensors file, each checked to lie within the
    data and to fill exactly its shape."""
    header, start = _safetensors_header(file, size)
    header.pop('__metadata__', None)
    data_size = size - start
    layout = {}
    for name, info in header.items():
        entry = info if type(info) is dict else {}
        dtype = SAFETENSORS_DTYPES.get(entry.get('dtype'))
        shape, offsets = entry.get('shape'), entry.get('data_offsets')
        if dtype is None:
            raise Damaged(f'tensor {name!r} has the dtype {entry.get("dtype")}'
                          f' (read: {", ".join(SAFETENSORS_DTYPES)})')
        if not (type(shape) is list and all(
                type(n) is int and n >= 0 for n in shape)
                and type(offsets) is list and len(offsets) == 2
                and all(type(n) is int for n in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data_size
                and offsets[1] - offsets[0] == _count(shape) *
                dtype.itemsize):
            raise Damaged(f'tensor {name!r} of shape {brief(shape)} does not '
                          f'fill its data_offsets {brief(offsets)} (of '
                          f'{data_size} bytes of data)')
        layout[name] = dtype, shape, offsets
    file.seek(start)
    data = file.read()
    return {
        name: torch.frombuffer(bytearray(data[begin:end]), dtype=dtype)
        .reshape(shape) if end > begin else torch.empty(shape, dtype=dtype)
        for name, (dtype, shape, (begin, end)) in layout.items()
    }


def _npy_layout(member) -> Tuple[np.dtype, int]:
    """(dtype, bytes claimed by its header) of an ``.npy`` stream."""
    version = np.lib.format.read_magic(member)
    read_header = {
        (1, 0): np.lib.format.read_array_header_1_0,
        (2, 0): np.lib.format.read_array_header_2_0
    }.get(version)
    if read_header is None:
        raise Damaged(f'.npy format version {version}')
    shape, _, dtype = read_header(member)
    return dtype, _count(shape) * dtype.itemsize


def read_npz(file: BinaryIO, infos: List[zipfile.ZipInfo]) -> NpzWeights:
    """The arrays of an ``.npz`` (:func:`.archive.python_view` checked the
    archive), each checked first: a plain numeric or bool dtype, and data of
    exactly the size its header claims."""
    file.seek(0)
    with zipfile.ZipFile(file) as archive:
        for info in infos:
            with archive.open(info) as member:
                dtype, nbytes = _npy_layout(member)
                held = info.file_size - member.tell()
            if dtype.kind not in NPY_KINDS or dtype.fields is not None or \
                    dtype.subdtype is not None:
                raise Refused(f'array {info.filename} has the dtype {dtype} '
                              '(plain numeric and bool arrays are read)')
            if nbytes != held:
                raise Damaged(f'array {info.filename} claims {nbytes} bytes '
                              f'and holds {held}')
    file.seek(0)
    with np.load(file, allow_pickle=False) as npz:
        return NpzWeights({k: npz[k] for k in npz.files})
