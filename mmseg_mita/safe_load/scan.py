"""A dry run of a checkpoint's pickles, before torch's unpickler runs them.

:class:`PickleScan` reads a pickle exactly as torch's weights-only
unpickler does (the same opcodes, read the same way) but calls nothing:
globals stay names, calls stay placeholders, persistent ids become storage
claims. What it checks is what torch's unpickler would do before checking
it, or never checks:

* every global is in :data:`ALLOWED` (torch's defaults minus the
  constructors that allocate memory from a number in the file, legacy tensor
  and storage classes, and minus the tensor kinds no checkpoint of ours
  holds, plus :data:`.allowed.NAMED`); bytes and bytearrays are built as
  protocol 2 pickles them, from latin-1 text (``bytearray(n)`` allocates,
  other codecs take time quadratic in their input);
* every storage a persistent id claims has its bytes in the file: a zip
  record of exactly that size (:mod:`.archive`), or, in the legacy format,
  a listed entry of the storage data within the file (:func:`scan_legacy`;
  torch allocates every claim first, and leaves a claim no entry lists
  uninitialised);
* a quantized tensor fits its storage (torch allocates its size first);
* a tensor has at most as many elements as its storage holds: torch checks
  only that a view's last element lies in its storage, so stride 0 or
  overlapping strides let a few stored bytes stand for a tensor of any size
  (a 637-byte file for a ``pos_embed`` of 16,000,001 x 32, which mmseg's
  position-embedding resize would materialise as 2 GB).

The offsets of tensor views are bounded by torch itself (``Tensor.set_``
checks them before anything is allocated); numpy arrays are bounded by
their bytes in the pickle (:mod:`.allowed`).
"""
import io
import pickle
import struct
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch._utils import IMPORT_MAPPING, NAME_MAPPING
from torch._weights_only_unpickler import _get_allowed_globals

from .allowed import NAMED, Name
from .errors import Damaged, Refused, brief

_TORCH_CALLABLES = frozenset({
    'torch._utils._rebuild_tensor', 'torch._utils._rebuild_tensor_v2',
    'torch._utils._rebuild_tensor_v3', 'torch._utils._rebuild_parameter',
    'torch._utils._rebuild_parameter_with_state',
    'torch._utils._rebuild_qtensor', 'torch.serialization._get_layout',
    'torch.Size', 'torch.device', 'collections.OrderedDict', 'builtins.set',
    'builtins.complex', 'builtins.bytearray', '_codecs.encode'
})
UNTYPED_STORAGE = 'torch.storage.UntypedStorage'  # float8, uint16... claims
_GLOBALS = _get_allowed_globals()
# name -> dtype: what a persistent id names as its storage type
STORAGE_DTYPES: Dict[str, torch.dtype] = {
    name: value.dtype
    for name, value in _GLOBALS.items()
    if isinstance(value, torch.serialization.StorageType)
}
ALLOWED = frozenset(
    name for name, value in _GLOBALS.items()
    if isinstance(value, (torch.dtype, torch.qscheme))) | frozenset(
        STORAGE_DTYPES) | _TORCH_CALLABLES | {UNTYPED_STORAGE} | frozenset(
            NAMED)


class _Result:
    """What a call returned (never looked into)."""
    __slots__ = ()


class Storage:
    """A claimed storage: its dtype and size in bytes."""
    __slots__ = ('dtype', 'nbytes')

    def __init__(self, dtype: torch.dtype, nbytes: int):
        self.dtype, self.nbytes = dtype, nbytes


def global_name(module: str, name: str) -> str:
    """``module.name`` as torch's unpickler maps it (Python 2 names)."""
    if (module, name) in NAME_MAPPING:
        module, name = NAME_MAPPING[module, name]
    elif module in IMPORT_MAPPING:
        module = IMPORT_MAPPING[module]
    return f'{module}.{name}'


def _numel(size: Any, what: str) -> int:
    if type(size) not in (tuple, list) or \
            any(type(n) is not int or n < 0 for n in size):
        raise Refused(f'{what} has the size {brief(size)}')
    count = 1
    for n in size:
        count *= n
    return count


def _rebuild_qtensor(storage=None, offset=None, size=None, *_):
    if type(storage) is not Storage:
        raise Refused('it rebuilds a quantized tensor without a storage')
    nbytes = _numel(size, 'a quantized tensor') * \
        torch._utils._element_size(storage.dtype)
    if nbytes > storage.nbytes:
        raise Refused(f'a quantized tensor of {nbytes} bytes lies on a '
                      f'storage of {storage.nbytes} bytes')
    return _Result()


def _tensor_bytes(storage: Any, size: Any,
                  dtype: Optional[torch.dtype] = None) -> None:
    """A tensor of ``size`` and ``dtype`` (default: the storage's) on
    ``storage`` (a :class:`Storage`; anything else torch refuses) has at
    most as many elements as the storage holds."""
    if type(storage) is not Storage:
        return
    dtype = storage.dtype if dtype is None else dtype
    nbytes = _numel(size, 'a tensor') * torch._utils._element_size(dtype)
    if nbytes > storage.nbytes:
        raise Refused(
            f'a tensor of shape {brief(tuple(size))} views {nbytes} bytes of '
            f'a storage of {storage.nbytes} bytes (stride 0 or overlapping '
            'strides: a tensor may have at most as many elements as its '
            'storage holds)')


def _rebuild_tensor(storage=None, offset=None, size=(), *_):
    """``_rebuild_tensor``, ``_rebuild_tensor_v2``: the storage's dtype."""
    _tensor_bytes(storage, size)
    return _Result()


def _rebuild_tensor_v3(storage=None, offset=None, size=(), stride=None,
                       requires_grad=None, hooks=None, dtype=None, *_):
    """``_rebuild_tensor_v3``: the dtype named after the hooks (the
    storage of float8 and unsigned tensors is untyped)."""
    dtype = _GLOBALS.get(dtype.name) if type(dtype) is Name else None
    if not isinstance(dtype, torch.dtype):
        raise Refused('it rebuilds a tensor of the dtype '
                      f'{brief(dtype)}')
    _tensor_bytes(storage, size, dtype)
    return _Result()


def _size(items=(), *_):
    return tuple(items) if type(items) in (tuple, list) else _Result()


def _encode(*args) -> bytes:
    """``_codecs.encode(text, 'latin1')``: bytes as protocol 2 pickles
    them (other codecs can take time quadratic in their input)."""
    if not (len(args) == 2 and type(args[0]) is str and args[1] == 'latin1'):
        raise Refused(f'it calls _codecs.encode{brief(args)} (admitted: '
                      "_codecs.encode(text, 'latin1'))")
    return args[0].encode('latin1')


def _bytearray(*args) -> _Result:
    """``bytearray()``, of bytes, or of latin-1 text (``bytearray(n)``
    allocates ``n`` bytes)."""
    of_bytes = len(args) == 1 and type(args[0]) is bytes
    of_text = len(args) == 2 and type(args[0]) is str and \
        args[1] == 'latin-1'
    if args and not (of_bytes or of_text):
        raise Refused(f'it calls bytearray{brief(args)} (admitted: '
                      "bytearray(bytes) and bytearray(text, 'latin-1'))")
    return _Result()


def _storage_from_size(*_):
    raise Refused(f'it calls {UNTYPED_STORAGE} (a storage is admitted as '
                  'the data of a tensor only)')


_CALLS: Dict[str, Callable] = {
    'torch._utils._rebuild_qtensor': _rebuild_qtensor,
    'torch._utils._rebuild_tensor': _rebuild_tensor,
    'torch._utils._rebuild_tensor_v2': _rebuild_tensor,
    'torch._utils._rebuild_tensor_v3': _rebuild_tensor_v3,
    'torch.Size': _size,
    'builtins.bytearray': _bytearray,
    '_codecs.encode': _encode,
    UNTYPED_STORAGE: _storage_from_size,
}
_NEW: Dict[str, Callable] = {
    'torch.Size': _size,
    UNTYPED_STORAGE: _storage_from_size,
}
_OP = {name: getattr(pickle, name)[0] for name in (
    'GLOBAL', 'NEWOBJ', 'REDUCE', 'BUILD', 'APPEND', 'APPENDS', 'SETITEM',
    'SETITEMS', 'MARK', 'TUPLE', 'TUPLE1', 'TUPLE2', 'TUPLE3', 'NONE',
    'NEWFALSE', 'NEWTRUE', 'EMPTY_TUPLE', 'EMPTY_LIST', 'EMPTY_DICT',
    'EMPTY_SET', 'BININT', 'BININT1', 'BININT2', 'BINFLOAT', 'BINUNICODE',
    'SHORT_BINSTRING', 'BINPERSID', 'BINGET', 'LONG_BINGET', 'BINPUT',
    'LONG_BINPUT', 'LONG1', 'PROTO', 'STOP')}
_CONSTANTS = {
    _OP['NONE']: lambda: None,
    _OP['NEWFALSE']: lambda: False,
    _OP['NEWTRUE']: lambda: True,
    _OP['EMPTY_TUPLE']: tuple,
    _OP['EMPTY_LIST']: list,
    _OP['EMPTY_DICT']: dict,
    _OP['EMPTY_SET']: set,
}
_FIXED = {  # opcode -> (bytes, struct format) of its argument
    _OP['BININT']: (4, '<i'),
    _OP['BININT1']: (1, '<B'),
    _OP['BININT2']: (2, '<H'),
    _OP['BINFLOAT']: (8, '>d'),
}


def _call(fn: Any, args: Any, new: bool) -> Any:
    if type(fn) is not Name:
        raise Refused('it calls an object that is not an admitted global')
    if type(args) not in (tuple, list):
        raise Refused(f'it calls {fn.name} with {brief(args)}')
    rule = (_NEW if new else _CALLS).get(fn.name)
    return _Result() if rule is None else rule(*args)


class PickleScan:
    """Reads one pickle from ``file`` as torch's weights-only unpickler
    would, calling nothing; ``claim(pid)`` checks each persistent id and
    returns its :class:`Storage`."""

    def __init__(self, file, claim: Callable[[Any], Storage]):
        self.read, self.readline, self.claim = file.read, file.readline, claim

    def _line(self) -> str:
        return self.readline()[:-1].decode('utf-8')

    def run(self) -> Any:
        """The pickled object, as far as it is plain data."""
        read, op_ = self.read, _OP
        stack, marks, memo = [], [], {}
        while True:
            key = read(1)
            if not key:
                raise EOFError('the pickle ends before its STOP')
            op = key[0]
            if op == op_['GLOBAL']:
                name = global_name(self._line(), self._line())
                if name not in ALLOWED:
                    raise Refused(f'unpickling it calls {name}, which is not '
                                  'admitted')
                stack.append(Name(name))
            elif op in (op_['REDUCE'], op_['NEWOBJ']):
                args = stack.pop()
                fn = stack.pop()
                stack.append(_call(fn, args, op == op_['NEWOBJ']))
            elif op == op_['BUILD']:
                stack.pop()
            elif op == op_['APPEND']:
                item = stack.pop()
                self._list(stack[-1]).append(item)
            elif op == op_['APPENDS']:
                items, stack = stack, marks.pop()
                self._list(stack[-1]).extend(items)
            elif op == op_['SETITEM']:
                value, name = stack.pop(), stack.pop()
                self._setitems(stack[-1], [name, value])
            elif op == op_['SETITEMS']:
                items, stack = stack, marks.pop()
                self._setitems(stack[-1], items)
            elif op == op_['MARK']:
                marks.append(stack)
                stack = []
            elif op == op_['TUPLE']:
                items, stack = stack, marks.pop()
                stack.append(tuple(items))
            elif op in (op_['TUPLE1'], op_['TUPLE2'], op_['TUPLE3']):
                n = 1 + op - op_['TUPLE1']
                if len(stack) < n:
                    raise IndexError('tuple of an empty stack')
                stack[-n:] = [tuple(stack[-n:])]
            elif op in _CONSTANTS:
                stack.append(_CONSTANTS[op]())
            elif op in _FIXED:
                size, fmt = _FIXED[op]
                stack.append(struct.unpack(fmt, read(size))[0])
            elif op == op_['BINUNICODE']:
                (length, ) = struct.unpack('<I', read(4))
                stack.append(str(read(length), 'utf-8', 'surrogatepass'))
            elif op == op_['SHORT_BINSTRING']:
                stack.append(read(read(1)[0]).decode('utf-8'))
            elif op == op_['LONG1']:
                stack.append(pickle.decode_long(read(read(1)[0])))
            elif op == op_['BINPERSID']:
                stack.append(self.claim(stack.pop()))
            elif op in (op_['BINGET'], op_['LONG_BINGET']):
                index = read(1)[0] if op == op_['BINGET'] else \
                    struct.unpack('<I', read(4))[0]
                stack.append(memo[index])
            elif op in (op_['BINPUT'], op_['LONG_BINPUT']):
                index = read(1)[0] if op == op_['BINPUT'] else \
                    struct.unpack('<I', read(4))[0]
                memo[index] = stack[-1]
            elif op == op_['PROTO']:
                read(1)
            elif op == op_['STOP']:
                return stack.pop()
            else:  # pickle protocols above 2 (torch.save writes 2)
                raise Refused(f'its pickle has the opcode {key!r}, which '
                              "torch's weights-only unpickler does not read")

    @staticmethod
    def _list(target: Any) -> list:
        if type(target) is not list:
            raise pickle.UnpicklingError(f'APPEND to a {type(target)}')
        return target

    @staticmethod
    def _setitems(target: Any, items: list) -> None:
        if type(target) is dict:  # other targets: what they hold is unused
            for i in range(0, len(items) - 1, 2):
                target[items[i]] = items[i + 1]


def _decoded(value: Any) -> Any:
    """``value`` as torch's ``_maybe_decode_ascii`` reads it."""
    return value.decode('ascii') if type(value) is bytes else value


def _storage_claim(pid: Any, length: int) -> Tuple[torch.dtype, str, int]:
    """(dtype, key, bytes) of a persistent id ``('storage', type, key,
    location, numel, ...)`` of ``length`` items."""
    if not (type(pid) is tuple and len(pid) == length
            and _decoded(pid[0]) == 'storage'):
        raise Refused(f'it holds the persistent id {brief(pid)}, not a '
                      'storage')
    kind, key, location, numel = pid[1:5]
    dtype = (torch.uint8 if length == 5 and kind.name == UNTYPED_STORAGE
             else STORAGE_DTYPES.get(kind.name)) \
        if type(kind) is Name else None
    if dtype is None or type(key) is not str or \
            type(_decoded(location)) is not str or \
            type(numel) is not int or numel < 0:
        raise Refused(f'it holds the storage {brief(pid)}')
    return dtype, key, numel * torch._utils._element_size(dtype)


class _ZipClaims:
    """Each storage of a zip checkpoint is a record of exactly its size
    (``sizes``: :attr:`.archive.TorchArchive.sizes`)."""

    def __init__(self, sizes: Dict[str, int]):
        self.sizes, self.seen = sizes, {}

    def __call__(self, pid: Any) -> Storage:
        dtype, key, nbytes = _storage_claim(pid, 5)
        if key not in self.seen:
            record = f'data/{key}'
            size = self.sizes.get(record)
            if size != nbytes:
                raise Refused(f'a tensor claims {nbytes} bytes of storage '
                              f'{record}, which holds '
                              f'{"none" if size is None else size}')
            self.seen[key] = Storage(dtype, nbytes)
        return self.seen[key]


def _no_persistent_id(pid: Any) -> Storage:
    raise Refused(f'it holds the persistent id {brief(pid)} outside its '
                  'tensors')


def scan_zip(archive) -> None:
    """Scan ``data.pkl`` of a zip checkpoint (``archive``: the
    :class:`.archive.TorchArchive` of the file)."""
    if 'data.pkl' not in archive.sizes:
        raise Damaged('a zip archive without data.pkl: no PyTorch file')
    PickleScan(io.BytesIO(archive.reader.get_record('data.pkl')),
               _ZipClaims(archive.sizes)).run()


class _LegacyClaims:
    """Storages of the legacy format: claimed while unpickling, their bytes
    follow the pickles, one entry per listed storage."""

    def __init__(self, file_size: int):
        self.file_size, self.claims = file_size, {}

    def __call__(self, pid: Any) -> Storage:
        dtype, key, nbytes = _storage_claim(pid, 6)
        if key not in self.claims:
            self.claims[key] = Storage(dtype, nbytes)
        view = pid[5]
        if view is None:
            return self.claims[key]
        size = torch._utils._element_size(dtype)
        if not (type(view) is tuple and len(view) == 3
                and type(view[0]) is str
                and all(type(n) is int and n >= 0 for n in view[1:])
                and (view[1] + view[2]) * size <= self.claims[key].nbytes):
            raise Refused(f'it holds the storage view {brief(view)} of a '
                          f'storage of {self.claims[key].nbytes} bytes')
        return Storage(dtype, view[2] * size)

    def check_data(self, file, keys: Any) -> None:
        """``keys`` (the list pickled after the objects) names each claimed
        storage once, and the file holds each one's bytes after it."""
        if type(keys) is not list or \
                any(type(k) is not str for k in keys) or \
                len(set(keys)) != len(keys):
            raise Refused(f'its list of storages is {brief(keys)}')
        unlisted = sorted(self.claims.keys() - set(keys))
        if unlisted:
            raise Refused(f'its tensors claim the storages {brief(unlisted)}'
                          ' whose data it lacks (they would load as '
                          'uninitialised memory)')
        unclaimed = sorted(set(keys) - self.claims.keys())
        if unclaimed:
            raise Refused(f'it lists the storages {brief(unclaimed)}, which '
                          'no tensor claims')
        end = file.tell()
        for key in keys:
            storage = self.claims[key]
            header = file.read(8)
            end += 8 + storage.nbytes
            if len(header) < 8 or end > self.file_size:
                raise Damaged(f'storage {key} claims {storage.nbytes} bytes '
                              f'up to byte {end} of a file of '
                              f'{self.file_size}')
            (numel, ) = struct.unpack('<q', header)
            if numel * torch._utils._element_size(storage.dtype) != \
                    storage.nbytes:
                raise Refused(f'storage {key} holds {numel} elements; its '
                              f'tensors claim {storage.nbytes} bytes')
            file.seek(end)


def scan_legacy(file, file_size: int) -> None:
    """Scan a checkpoint of torch's legacy (non-zip) format from the start
    of ``file``: three header pickles (magic number, protocol, system info),
    the objects, the list of storages, then the storages' bytes."""
    serialization = torch.serialization
    try:
        header = [PickleScan(file, _no_persistent_id).run() for _ in range(3)]
    except Exception:  # noqa: B902  (no pickle at all, or a broken one)
        header = None
    if not (header and type(header[0]) is int and header[0] ==
            serialization.MAGIC_NUMBER and type(header[1]) is int
            and header[1] == serialization.PROTOCOL_VERSION):
        raise Damaged('it starts with neither a zip archive, a safetensors '
                      "header nor torch's legacy magic number and protocol")
    claims = _LegacyClaims(file_size)
    PickleScan(file, claims).run()
    claims.check_data(file, PickleScan(file, _no_persistent_id).run())
