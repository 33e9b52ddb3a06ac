"""Checkpoint files written as an attacker would, for
tests/test_safe_load.py: a pickle assembler emitting raw opcodes
(:func:`dumps` of :class:`Global`/:class:`Call`/:class:`Build`...
expressions), zip archives and torch's legacy format laid out byte by byte,
a runner that tries a file in a process of its own (:func:`attempt`); and,
for tests/test_checkpoint_formats.py, :func:`assert_same` (what a loaded
checkpoint must equal)."""
import multiprocessing
import os
import pickle
import resource
import struct
import sys
import traceback
import zlib
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

MAGIC_NUMBER = 0x1950a86a20f9469cfc6c  # torch.serialization's legacy format
PROTOCOL_VERSION = 1001
MARKER = 'MMSEG_MITA_RAN_CODE'  # printed by code a crafted file runs

# --- pickles ---------------------------------------------------------------


class Global(NamedTuple):
    module: str
    name: str


class Call(NamedTuple):
    """``fn(*args)``: REDUCE (NEWOBJ if ``new``)."""
    fn: Any
    args: tuple = ()
    new: bool = False


class Build(NamedTuple):
    """``target``, then BUILD with ``state``: leaves ``target``."""
    target: Any
    state: Any


class PersistentId(NamedTuple):
    pid: Any


class Raw(NamedTuple):
    """Opcodes as they are."""
    data: bytes


def _int(n: int) -> bytes:
    if 0 <= n < 256:
        return b'K' + bytes([n])
    if 0 <= n < 65536:
        return b'M' + struct.pack('<H', n)
    if -2**31 <= n < 2**31:
        return b'J' + struct.pack('<i', n)
    data = pickle.encode_long(n)
    return b'\x8a' + bytes([len(data)]) + data


def _emit(value: Any) -> bytes:
    if value is None:
        return b'N'
    if value is True or value is False:
        return b'\x88' if value else b'\x89'
    if type(value) is int:
        return _int(value)
    if type(value) is float:
        return b'G' + struct.pack('>d', value)
    if type(value) is str:
        data = value.encode('utf-8', 'surrogatepass')
        return b'X' + struct.pack('<I', len(data)) + data
    if type(value) is bytes:  # as protocol 2 writes bytes
        return _emit(Call(Global('_codecs', 'encode'),
                          (value.decode('latin1'), 'latin1')))
    if type(value) is Global:
        return f'c{value.module}\n{value.name}\n'.encode()
    if type(value) is Call:
        return _emit(value.fn) + _emit(tuple(value.args)) + (
            b'\x81' if value.new else b'R')
    if type(value) is Build:
        return _emit(value.target) + _emit(value.state) + b'b'
    if type(value) is PersistentId:
        return _emit(value.pid) + b'Q'
    if type(value) is Raw:
        return value.data
    if type(value) is tuple:
        return b'(' + b''.join(map(_emit, value)) + b't'
    if type(value) is list:
        return b']' + (b'(' + b''.join(map(_emit, value)) + b'e'
                       if value else b'')
    if type(value) is dict:
        return b'}' + (b'(' + b''.join(
            _emit(k) + _emit(v) for k, v in value.items()) + b'u'
                       if value else b'')
    raise TypeError(f'cannot emit {value!r}')


def dumps(value: Any) -> bytes:
    """A protocol-2 pickle of ``value`` (plain data and the expressions
    above), opcode by opcode."""
    return b'\x80\x02' + _emit(value) + b'.'


def rebuild_tensor(pid: tuple, size: tuple) -> Call:
    """``torch._utils._rebuild_tensor_v2`` of the storage ``pid``, contiguous
    (what ``torch.save`` writes for a tensor)."""
    stride, step = [], 1
    for n in reversed(size):
        stride.insert(0, step)
        step *= n
    return Call(Global('torch._utils', '_rebuild_tensor_v2'),
                (PersistentId(pid), 0, tuple(size), tuple(stride), False,
                 Call(Global('collections', 'OrderedDict'))))


def zip_storage(key: str, numel: int, storage: str = 'FloatStorage'):
    return ('storage', Global('torch', storage), key, 'cpu', numel)


def legacy_storage(key: str, numel: int, storage: str = 'FloatStorage',
                   view=None):
    return zip_storage(key, numel, storage) + (view, )


# --- zip archives ----------------------------------------------------------


class Member(NamedTuple):
    name: str
    data: bytes  # as stored (compressed for deflate)
    size: int  # uncompressed
    crc: int
    method: int = 0  # 0 stored, 8 deflate
    # (size, stored size) of each zip64 field of the central entry, which
    # then states 0xFFFFFFFF for both sizes
    zip64: Tuple[Tuple[int, int], ...] = ()


def stored(name: str, data: bytes) -> Member:
    return Member(name, data, len(data), zlib.crc32(data))


def deflated_zeros(name: str, size: int, prefix: bytes = b'') -> Member:
    """``prefix`` then ``size`` zero bytes, deflated in 1 MiB steps (a
    decompression bomb, built without holding it)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    crc, parts, left = zlib.crc32(prefix), [compressor.compress(prefix)], size
    chunk = bytes(1 << 20)
    while left:
        step = chunk[:min(left, len(chunk))]
        crc, left = zlib.crc32(step, crc), left - len(step)
        parts.append(compressor.compress(step))
    parts.append(compressor.flush())
    return Member(name, b''.join(parts), len(prefix) + size, crc, 8)


def local_entry(member: Member) -> bytes:
    name = member.name.encode()
    return struct.pack('<4s5H3I2H', b'PK\x03\x04', 20, 0, member.method, 0,
                       0, member.crc, len(member.data), member.size,
                       len(name), 0) + name + member.data


def _central(member: Member, offset: int, comment: bytes = b'') -> bytes:
    name = member.name.encode()
    sizes = (len(member.data), member.size)
    extra = b''.join(
        struct.pack('<2H2Q', 1, 16, size, stored_size)
        for size, stored_size in member.zip64)
    if member.zip64:
        sizes = (0xFFFFFFFF, 0xFFFFFFFF)
    return struct.pack('<4s6H3I5H2I', b'PK\x01\x02', 20, 20, 0,
                       member.method, 0, 0, member.crc, *sizes, len(name),
                       len(extra), len(comment), 0, 0, 0,
                       offset) + name + extra + comment


def _end(count: int, cd_size: int, cd_offset: int) -> bytes:
    return struct.pack('<4s4H2IH', b'PK\x05\x06', 0, 0, count, count,
                       cd_size, cd_offset, 0)


def _end64(count: int, cd_size: int, cd_offset: int) -> bytes:
    """A zip64 end record (as torch.save writes one)."""
    return struct.pack('<4sQ2H2I4Q', b'PK\x06\x06', 44, 45, 45, 0, 0,
                       count, count, cd_size, cd_offset)


def _locator(end64_offset: int) -> bytes:
    return struct.pack('<4sIQI', b'PK\x06\x07', 0, end64_offset, 1)


def zip_archive(members: List[Member]) -> bytes:
    """A zip archive, laid out as ``zipfile`` and miniz write one."""
    data, directory = b'', b''
    for member in members:
        directory += _central(member, len(data))
        data += local_entry(member)
    return data + directory + _end(len(members), len(directory), len(data))


def _directory(members: List[Member], first: int, pad: int = 0) -> bytes:
    """Central directory entries of ``members`` laid out from offset
    ``first``; ``pad`` bytes of comment on the last one."""
    entries, at = [], first
    for i, member in enumerate(members):
        comment = b'c' * pad if i == len(members) - 1 else b''
        entries.append(_central(member, at, comment))
        at += len(local_entry(member))
    return b''.join(entries)


def two_directory_zip(for_torch: List[Member],
                      for_python: List[Member]) -> bytes:
    """One file, two archives: torch's reader (which follows the directory
    offset the end record states) sees ``for_torch``; Python's ``zipfile``
    (which finds the directory just before the end record and shifts every
    offset by its distance from the stated one) sees ``for_python``. Both
    directories get one size and count (a file comment, empty members).

    Layout: torch's members, a gap, torch's directory (where the end record
    points), Python's members, Python's directory, the end record."""
    for_torch, for_python = list(for_torch), list(for_python)
    while len(for_torch) != len(for_python):
        short = min(for_torch, for_python, key=len)
        short.append(stored(f'{short[0].name.split("/")[0]}/pad'
                            f'{len(short)}', b''))
    torch_data = b''.join(map(local_entry, for_torch))
    python_data = b''.join(map(local_entry, for_python))
    sizes = [len(_directory(m, 0)) for m in (for_torch, for_python)]
    size = max(sizes)
    stated = len(torch_data) + len(python_data)  # the gap keeps offsets >= 0
    torch_dir = _directory(for_torch, 0, size - sizes[0])
    # zipfile's shift: Python's directory lies size + len(python_data)
    # after the stated offset
    python_dir = _directory(for_python, stated - len(python_data),
                            size - sizes[1])
    return (torch_data + bytes(len(python_data)) + torch_dir + python_data +
            python_dir + _end(len(for_python), size, stated))


def two_zip64_records(for_torch: List[Member],
                      for_python: List[Member]) -> bytes:
    """One file, two archives told apart by their zip64 end records: torch's
    reader follows the zip64 locator to the record of ``for_torch``,
    Python's ``zipfile`` reads the record just before the locator, that of
    ``for_python``; the end record states ``for_python``'s directory.

    Layout: torch's members, directory and zip64 record, Python's members,
    directory and zip64 record, the locator, the end record."""
    torch_data = b''.join(map(local_entry, for_torch))
    torch_dir = _directory(for_torch, 0)
    torch_end = len(torch_data) + len(torch_dir)
    first = torch_end + 56
    python_data = b''.join(map(local_entry, for_python))
    python_dir = _directory(for_python, first)
    python_at = first + len(python_data)
    return (torch_data + torch_dir +
            _end64(len(for_torch), len(torch_dir), len(torch_data)) +
            python_data + python_dir +
            _end64(len(for_python), len(python_dir), python_at) +
            _locator(torch_end) +
            _end(len(for_python), len(python_dir), python_at))


def checkpoint_members(data_pkl: bytes, storages: Dict[str, bytes],
                       archive: str = 'archive') -> List[Member]:
    """The members of a torch zip checkpoint (``data.pkl``, one
    ``data/KEY`` per storage)."""
    return [stored(f'{archive}/data.pkl', data_pkl)] + [
        stored(f'{archive}/data/{key}', value)
        for key, value in storages.items()
    ] + [
        stored(f'{archive}/byteorder', b'little'),
        stored(f'{archive}/version', b'3\n')
    ]


def torch_zip(data_pkl: bytes, storages: Dict[str, bytes] = None) -> bytes:
    return zip_archive(checkpoint_members(data_pkl, storages or {}))


def legacy(objects: bytes, keys: List[str],
           storages: List[Tuple[int, bytes]]) -> bytes:
    """torch's legacy format: magic number, protocol, system info, the
    objects pickle, the list of storage keys, then per storage its element
    count (8 bytes) and bytes."""
    sys_info = {'protocol_version': PROTOCOL_VERSION, 'little_endian': True,
                'type_sizes': {'short': 2, 'int': 4, 'long': 4}}
    return (dumps(MAGIC_NUMBER) + dumps(PROTOCOL_VERSION) + dumps(sys_info) +
            objects + dumps(list(keys)) + b''.join(
                struct.pack('<q', numel) + data for numel, data in storages))


def assert_same(got: Any, want: Any, where: str = 'checkpoint') -> None:
    """``got`` equals ``want`` (full unpickling of the same file): types,
    values, dtypes and layouts throughout."""
    import argparse

    import numpy as np
    import torch
    from mmengine.logging import HistoryBuffer
    assert type(got) is type(want), (where, type(got), type(want))
    if isinstance(want, torch.Tensor):
        assert (got.dtype, got.shape, got.stride(), got.requires_grad,
                got.is_conj()) == (want.dtype, want.shape, want.stride(),
                                   want.requires_grad, want.is_conj()), where
        if want.is_quantized:
            assert got.qscheme() == want.qscheme(), where
            got, want = got.int_repr(), want.int_repr()
        # as bytes: eq is not implemented for every dtype (float8, uint32)
        got, want = (t.resolve_conj().contiguous().flatten().view(
            torch.uint8) for t in (got, want))
        assert torch.equal(got, want), where
    elif isinstance(want, np.ndarray):
        assert (got.dtype, got.shape, got.flags.f_contiguous) == (
            want.dtype, want.shape, want.flags.f_contiguous), where
        assert np.array_equal(got, want), where
    elif isinstance(want, HistoryBuffer):
        assert_same(vars(got), {k: v for k, v in vars(want).items()
                                if k != 'statistics_methods'}, where)
    elif isinstance(want, argparse.Namespace):
        assert_same(vars(got), vars(want), where)
    elif isinstance(want, dict):
        assert list(got) == list(want), where
        for key in want:
            assert_same(got[key], want[key], f'{where}[{key!r}]')
    elif isinstance(want, (list, tuple)) and not isinstance(want,
                                                            torch.Size):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, f'{where}[{i}]')
    elif callable(want) and not isinstance(want, type):
        assert got is want, where
    else:
        assert got == want and repr(got) == repr(want), where


# --- trying a file in a process of its own ---------------------------------


def snapshot() -> Dict[str, Any]:
    """What a load must leave as it was: the attributes, defaults and code
    of what the loader admits and of the modules around it, torch's allowed
    and safe globals, HistoryBuffer's table of statistics methods."""
    import argparse
    import collections

    import numpy as np
    import torch
    import torch._weights_only_unpickler as wo
    from mmengine.logging import history_buffer
    from mmengine.optim.scheduler import param_scheduler

    def ident(value):  # sets are rebuilt on every change: their items
        return frozenset(map(id, value)) if isinstance(
            value, (set, frozenset)) else id(value)

    state = {}
    modules = (torch, torch._utils, torch.serialization, wo, np,
               np.core.multiarray, argparse, collections, history_buffer,
               param_scheduler)
    objects = [torch._utils._rebuild_tensor_v2, argparse.Namespace,
               history_buffer.HistoryBuffer, collections.OrderedDict,
               param_scheduler.OneCycleParamScheduler]
    objects += [v for v in vars(history_buffer.HistoryBuffer).values()
                if callable(v)]
    for module in modules:
        state[module.__name__] = {
            k: ident(v)
            for k, v in vars(module).items()
        }
    for obj in objects + list(wo._get_allowed_globals().values()):
        name = getattr(obj, '__qualname__', repr(obj))
        state[name] = {
            k: id(v) for k, v in getattr(obj, '__dict__', {}).items()
        }
        for attr in ('__defaults__', '__kwdefaults__', '__code__', '_dtype'):
            state[name][attr] = repr(getattr(obj, attr, None))
    state['allowed'] = {k: id(v) for k, v in wo._get_allowed_globals().items()}
    state['safe'] = repr(torch.serialization.get_safe_globals())
    state['statistics'] = dict(
        history_buffer.HistoryBuffer._statistics_methods)
    return state


ENTRY_POINTS = ('load_checkpoint', 'mmengine', 'converter', 'init_cfg')


def _entry(entry: str, path: str) -> None:
    from mmengine.runner.checkpoint import CheckpointLoader

    from mmseg_mita.converters import read_checkpoint
    from mmseg_mita.models import MiTAViT
    from mmseg_mita.safe_load import load_checkpoint
    if entry == 'load_checkpoint':
        load_checkpoint(path)
    elif entry == 'mmengine':  # load_from, --resume, tools/test.py
        CheckpointLoader.load_checkpoint(path)
    elif entry == 'converter':
        read_checkpoint(path)
    else:
        MiTAViT(img_size=(32, 32), patch_size=8, embed_dims=32, num_layers=1,
                num_heads=2, init_cfg=dict(type='Pretrained',
                                           checkpoint=path)).init_weights()


def _canary(path: str) -> bool:
    """A file saved before the attack loads as saved (a changed rebuild
    function would change every tensor loaded afterwards)."""
    import torch
    return torch.equal(torch.load(path, weights_only=True)['w'],
                       torch.arange(4.))


def _attempt(path: str, canary: str, control: bool) -> dict:
    os.environ.pop('MMSEG_MITA_UNSAFE_LOAD', None)
    from mmengine.logging.history_buffer import HistoryBuffer
    HistoryBuffer()  # the defaults registered, as in any mmengine run
    for entry in ENTRY_POINTS:  # lazy imports done before the snapshot
        try:
            _entry(entry, canary)
        except Exception:  # noqa: B902  (init_cfg: not a backbone)
            pass
    before = snapshot()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {}
    for entry in ENTRY_POINTS:
        try:
            _entry(entry, path)
            out[entry] = ('loaded', '')
        except Exception as e:  # noqa: B902  (what the test asserts)
            out[entry] = (type(e).__name__, str(e))
    out['rss_growth_mib'] = (resource.getrusage(resource.RUSAGE_SELF)
                             .ru_maxrss - rss) / 1024
    after = snapshot()
    out['changed'] = sorted(k for k in before if before[k] != after[k])
    out['canary'] = _canary(canary)
    if control:  # what full unpickling does with the file
        try:
            import torch
            torch.load(path, weights_only=False)
            out['control'] = 'loaded'
        except Exception as e:  # noqa: B902
            out['control'] = f'{type(e).__name__}: {e}'
    return out


class Outcome(NamedTuple):
    exitcode: Optional[int]  # None: killed after the timeout
    result: Optional[dict]
    output: str  # stdout and stderr of the process
    created: List[str]  # files the attempt left in its directory


def _forkserver():
    ctx = multiprocessing.get_context('forkserver')
    ctx.set_forkserver_preload(
        ['mmseg_mita.mmseg_plugin', 'mmseg_mita.models', 'crafted'])
    return ctx


# multiprocessing's exit code of a forkserver child whose status it could
# not read from the fork server.
STATUS_LOST = 255


def attempt(path: str, work: str, timeout: float = 60,
            control: bool = False) -> Outcome:
    """Try the file at ``path`` through every in-process entry point in a
    process forked from a server that has the stack imported (a crash or a
    hang ends that process only), in the directory ``work`` (holding
    nothing but ``path``); ``control``: then ``torch.load(weights_only=
    False)``, what full unpickling does with it.

    Two full-suite CI runs each had one attempt (of 42, run two at a time)
    end with :data:`STATUS_LOST` after its child had sent a complete
    result, a different file each time: such an attempt, which left no
    file behind, is tried once more. A child that really exits with 255
    does so again and is reported."""
    outcome = _attempt_once(path, work, timeout, control)
    if (outcome.exitcode == STATUS_LOST and outcome.result is not None
            and not outcome.created):
        outcome = _attempt_once(path, work, timeout, control)
    return outcome


def _attempt_once(path: str, work: str, timeout: float,
                  control: bool) -> Outcome:
    import torch
    canary = os.path.join(os.path.dirname(work), 'canary.pth')
    if not os.path.exists(canary):
        torch.save({'w': torch.arange(4.)}, canary)
    ctx = _forkserver()
    before = set(os.listdir(work))
    log = os.path.join(os.path.dirname(work), os.path.basename(work) + '.log')
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child,
                          args=(work, log, path, canary, control, send))
    process.start()
    send.close()
    result = None
    if receive.poll(timeout):  # a result, or the end of a crashed process
        try:
            result = receive.recv()
        except EOFError:
            pass
    process.join(5)
    hung = process.is_alive()
    if hung:
        process.kill()
        process.join()
    with open(log) as f:
        output = f.read()
    return Outcome(None if hung else process.exitcode, result, output,
                   sorted(set(os.listdir(work)) - before))


def _child(work: str, log: str, path: str, canary: str, control: bool,
           send) -> None:
    os.chdir(work)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        send.send(_attempt(path, canary, control))
    except BaseException:  # noqa: B902
        traceback.print_exc()
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
