"""Zip archives (torch's format since 1.6, NumPy's ``.npz``) checked before
any member is used.

Python's ``zipfile`` and torch's reader locate members differently: zipfile
finds the central directory just before the end record and tolerates data
prepended to the archive, torch's reader follows the offsets the end record
states. A file can hold two directories, one for each reader. So a torch
archive is read through torch's own reader, and refused unless both readers
see the same members at the same offsets with the same sizes (then the
CRC-32 check, which torch does not do, covers exactly the bytes torch
reads).
"""
import struct
import zipfile
import zlib
from typing import BinaryIO, List

import torch

from .errors import Damaged, Refused, brief

# members may decompress to at most this many times the file's size (and
# 64 MiB): deflate reaches about 1000, weights about 1.1
MAX_INFLATION = 100
MIN_INFLATION_BOUND = 64 << 20
_LOCAL_HEADER = b'PK\x03\x04'


def is_zip(file: BinaryIO) -> bool:
    """The file starts as a zip archive (the test torch applies)."""
    file.seek(0)
    return file.read(4) == _LOCAL_HEADER


def python_view(file: BinaryIO, size: int) -> List[zipfile.ZipInfo]:
    """The members as Python's ``zipfile`` reads them, each checked against
    its CRC-32 (after their declared sizes are checked against
    :data:`MAX_INFLATION`, so that no bomb is inflated)."""
    file.seek(0)
    try:
        with zipfile.ZipFile(file) as archive:
            infos = archive.infolist()
            total = sum(info.file_size for info in infos)
            if total > max(MAX_INFLATION * size, MIN_INFLATION_BOUND):
                raise Refused(
                    f'its members decompress to {total} bytes, more than '
                    f'{MAX_INFLATION} times the file ({size} bytes)')
            bad = archive.testzip()
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError,
            NotImplementedError, RuntimeError) as e:
        # OSError: offsets pointing before the file's start (bytes lost);
        # NotImplementedError, RuntimeError: unknown compression, encryption
        raise Damaged(f'{type(e).__name__}: {e}') from e
    if bad is not None:
        raise Damaged(f'member {bad} fails its CRC-32 check')
    return infos


def _data_offset(file: BinaryIO, info: zipfile.ZipInfo) -> int:
    file.seek(info.header_offset)
    header = file.read(30)  # checked by testzip: a local header
    name_len, extra_len = struct.unpack('<HH', header[26:30])
    return info.header_offset + 30 + name_len + extra_len


def torch_reader(file: BinaryIO, infos: List[zipfile.ZipInfo]):
    """torch's reader of the archive (``torch._C.PyTorchFileReader``), once
    it is known to agree with ``infos`` (:func:`python_view`), to store its
    members uncompressed (as ``torch.save`` does) and to be no TorchScript
    archive (which ``torch.load`` hands to ``torch.jit.load``)."""
    file.seek(0)
    try:
        reader = torch._C.PyTorchFileReader(file)
        records = reader.get_all_records()
    except RuntimeError as e:
        raise Damaged("torch's zip reader: " + str(e).split('.')[0]) from e
    if 'constants.pkl' in records:
        raise Refused('it is a TorchScript archive, not a checkpoint (load '
                      'it with torch.jit.load)')
    names = [info.filename for info in infos]
    prefix = names[0].split('/')[0] + '/' if names else ''
    python = {
        name[len(prefix):]: info
        for name, info in zip(names, infos) if name.startswith(prefix)
    }
    if len(python) != len(names) or len(set(names)) != len(names) or \
            sorted(records) != sorted(python):
        raise Refused(
            "torch's zip reader and Python's zipfile see different members "
            f'({brief(sorted(records))} and {brief(names)}): data before the '
            'archive, a second directory or a member listed twice')
    for name in records:
        info = python[name]
        by_torch = (reader.get_record_header_offset(name),
                    reader.get_record_offset(name),
                    reader.get_record_size(name))
        by_python = (info.header_offset, _data_offset(file, info),
                     info.file_size)
        if by_torch != by_python:
            raise Refused(
                f"torch's zip reader and Python's zipfile read member {name} "
                f'at different places (header, data, size: {by_torch} and '
                f'{by_python}): data before the archive or a second '
                'directory')
        if info.compress_type != zipfile.ZIP_STORED:
            raise Refused(f'member {name} is compressed; torch.save stores '
                          'members uncompressed')
    return reader
