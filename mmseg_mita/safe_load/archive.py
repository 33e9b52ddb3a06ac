"""Zip archives (torch's format since 1.6, NumPy's ``.npz``) checked before
any member is used.

Python's ``zipfile`` and torch's reader (miniz) locate members differently:
zipfile finds the central directory just before the end record and
tolerates data prepended to the archive (it shifts every offset by the
difference), torch's reader follows the offsets the end records state. A
file can hold two directories, one for each reader. So a torch archive is
read through torch's own reader, and refused unless both readers take the
same end records and the same central directory (:func:`directory_offset`)
and see the same members, stored whole, each with at most one zip64 field:
then both read each member's offset and size from the same bytes, and the
CRC-32 check, which torch does not do, covers exactly the bytes torch
reads. (This asks nothing of torch's reader but ``get_all_records`` and
``get_record_offset``, both in torch 2.6.0 already; a member's data
offset as torch reads it and zipfile's start of the directory are compared
as well, as cross-checks of these rules.)
"""
import struct
import zipfile
import zlib
from typing import BinaryIO, Dict, List, NamedTuple

import torch

from .errors import Damaged, Refused, brief

# members may decompress to at most this many times the file's size (and
# 64 MiB): deflate reaches about 1000, weights about 1.1
MAX_INFLATION = 100
MIN_INFLATION_BOUND = 64 << 20
_LOCAL_HEADER = b'PK\x03\x04'
# the end of central directory record, the zip64 locator and zip64 record
_END = struct.Struct('<4s4H2IH')
_END_SIG = b'PK\x05\x06'
_LOCATOR = struct.Struct('<4sIQI')
_LOCATOR_SIG = b'PK\x06\x07'
_END64 = struct.Struct('<4sQ2H2I4Q')
_END64_SIG = b'PK\x06\x06'
_ZIP64_FIELD = 0x0001  # the extra field of a member's zip64 sizes, offset


class ZipView(NamedTuple):
    """An archive as Python's ``zipfile`` reads it."""
    infos: List[zipfile.ZipInfo]
    directory_offset: int  # where it read the central directory


class TorchArchive(NamedTuple):
    """torch's reader of an archive checked by :func:`torch_reader`, and its
    records' sizes in bytes (as both readers see them)."""
    reader: 'torch._C.PyTorchFileReader'
    sizes: Dict[str, int]


def is_zip(file: BinaryIO) -> bool:
    """The file starts as a zip archive (the test torch applies)."""
    file.seek(0)
    return file.read(4) == _LOCAL_HEADER


def python_view(file: BinaryIO, size: int) -> ZipView:
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
            offset = archive.start_dir
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError,
            NotImplementedError, RuntimeError) as e:
        # OSError: offsets pointing before the file's start (bytes lost);
        # NotImplementedError, RuntimeError: unknown compression, encryption
        raise Damaged(f'{type(e).__name__}: {e}') from e
    if bad is not None:
        raise Damaged(f'member {bad} fails its CRC-32 check')
    return ZipView(infos, offset)


def _read(file: BinaryIO, offset: int, layout: struct.Struct) -> tuple:
    file.seek(offset)
    return layout.unpack(file.read(layout.size))


def directory_offset(file: BinaryIO, size: int) -> int:
    """Where the end records state that the central directory starts, once
    they are laid out so that Python's ``zipfile`` and torch's reader take
    the same ones: the end record is the file's last 22 bytes (no comment;
    zipfile looks there first, miniz takes the last one it finds searching
    backwards); a zip64 locator before it points at the zip64 record just
    before itself (where zipfile reads that record; miniz follows the
    pointer); the central directory ends where these records begin
    (zipfile would shift every offset by the difference)."""
    end = size - _END.size  # >= 0: zipfile found an end record
    sig, *_, dir_size, offset, comment = _read(file, end, _END)
    if sig != _END_SIG or comment:
        raise Refused('its end record is not its last 22 bytes (an archive '
                      'comment or data after the archive)')
    locator = end - _LOCATOR.size
    if locator >= _END64.size and \
            _read(file, locator, _LOCATOR)[0] == _LOCATOR_SIG:
        stated = _read(file, locator, _LOCATOR)[2]
        end = locator - _END64.size
        record = _read(file, end, _END64)
        if stated != end or record[0] != _END64_SIG:
            raise Refused(f'its zip64 locator points at byte {stated}, not '
                          f'at a zip64 end record just before it ({end})')
        dir_size, offset = record[8:10]
    if offset + dir_size != end:
        raise Refused(
            f'its central directory ({dir_size} bytes from byte {offset}) '
            f'does not end where its end records begin ({end}): data before '
            'the archive or a second directory')
    return offset


def _data_offset(file: BinaryIO, info: zipfile.ZipInfo) -> int:
    file.seek(info.header_offset)
    header = file.read(30)  # checked by testzip: a local header
    name_len, extra_len = struct.unpack('<HH', header[26:30])
    return info.header_offset + 30 + name_len + extra_len


def _zip64_fields(extra: bytes) -> int:
    """How many zip64 fields a member's extra data holds (zipfile reads
    each one that finds a size still at its 0xFFFFFFFF mark, miniz the
    first only)."""
    count = 0
    while len(extra) >= 4:
        kind, length = struct.unpack('<HH', extra[:4])
        count += kind == _ZIP64_FIELD
        extra = extra[4 + length:]
    return count


def _check_member(file: BinaryIO, name: str, info: zipfile.ZipInfo,
                  torch_offset: int) -> None:
    """``info`` (the member ``name`` as zipfile reads it) is stored whole,
    with at most one zip64 field, at the data offset torch reads
    (``torch_offset``: a cross-check of :func:`directory_offset`)."""
    if info.compress_type != zipfile.ZIP_STORED:
        raise Refused(f'member {name} is compressed; torch.save stores '
                      'members uncompressed')
    fields = _zip64_fields(info.extra)
    if info.compress_size != info.file_size or fields > 1:
        raise Refused(
            f'member {name} states {info.compress_size} bytes stored for '
            f'{info.file_size} bytes of data, with {fields} zip64 fields: '
            'torch would read bytes the CRC-32 check did not cover')
    offset = _data_offset(file, info)
    if torch_offset != offset:
        raise Refused(
            f"torch's zip reader and Python's zipfile read member {name} "
            f'at different places ({torch_offset} and {offset})')


def torch_reader(file: BinaryIO, view: ZipView, size: int) -> TorchArchive:
    """torch's reader of the archive (``torch._C.PyTorchFileReader``), once
    it is known to agree with ``view`` (:func:`python_view`), to store its
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
    names = [info.filename for info in view.infos]
    prefix = names[0].split('/')[0] + '/' if names else ''
    python = {
        name[len(prefix):]: info
        for name, info in zip(names, view.infos) if name.startswith(prefix)
    }
    if len(python) != len(names) or len(set(names)) != len(names) or \
            sorted(records) != sorted(python):
        raise Refused(
            "torch's zip reader and Python's zipfile see different members "
            f'({brief(sorted(records))} and {brief(names)}): data before the '
            'archive, a second directory or a member listed twice')
    stated = directory_offset(file, size)
    if view.directory_offset != stated:  # a cross-check of zipfile's rules
        raise Refused(f"Python's zipfile read the central directory at byte "
                      f'{view.directory_offset}, not at byte {stated}, '
                      'where the end record states it')
    for name in records:
        _check_member(file, name, python[name],
                      reader.get_record_offset(name))
    return TorchArchive(reader,
                        {name: python[name].file_size
                         for name in records})
