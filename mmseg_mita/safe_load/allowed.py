"""What torch's weights-only unpickler admits besides its own defaults, for
the duration of one load (:func:`admitted`).

mmengine's runner checkpoints pickle numpy arrays, dtypes and scalars (the
message hub's buffers), mmengine's ``HistoryBuffer`` with its statistics
methods (``getattr(HistoryBuffer, 'mean')``), and the annealing function of
``OneCycleLR`` (``getattr(OneCycleParamScheduler, '_annealing_cos')``);
DeiT checkpoints an ``argparse.Namespace``. Each such name is mapped to an
object of this module, never to the object it names, so that nothing of
numpy or mmengine is reachable from the file:

* the names of numpy's ``_reconstruct``, ``scalar`` and ``dtype``, of
  ``HistoryBuffer`` and of ``getattr`` build *pending* objects of private
  classes. The pickle's BUILD reaches them only through their
  ``__setstate__``, which validates the state in full before it builds a
  fresh object: numeric and bool dtypes only (no object, structured,
  sub-array or flag-altered dtype), arrays whose bytes are exactly their
  shape times their item size, buffers holding two such 1-D arrays and the
  four statistics methods by their own names. :func:`resolve` then replaces
  each pending object by what it built.
* ``numpy.ndarray`` and ``OneCycleParamScheduler`` name inert tokens,
  accepted only as the first argument of ``_reconstruct`` and ``getattr``.
* ``argparse.Namespace`` and ``frozenset`` are admitted as they are: torch's
  unpickler calls or BUILDs only fresh instances of them.

``HistoryBuffer``'s shared table of statistics methods is never written:
the methods a checkpoint names are checked (``min``, ``max``, ``current``
and ``mean``, each by its own name) and dropped; a built buffer gets
mmengine's defaults registered where missing, as its constructor does.
"""
import argparse
import contextlib
import importlib
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from .errors import Refused, brief

NUMPY_DTYPES = frozenset({
    'b1', 'i1', 'i2', 'i4', 'i8', 'u1', 'u2', 'u4', 'u8', 'f2', 'f4', 'f8',
    'c8', 'c16'
})
STATISTICS = ('min', 'max', 'current', 'mean')
ANNEALING = ('_annealing_cos', '_annealing_linear')
HISTORY_BUFFER = 'mmengine.logging.history_buffer.HistoryBuffer'
ONE_CYCLE = 'mmengine.optim.scheduler.param_scheduler.OneCycleParamScheduler'
_BUFFER_FIELDS = frozenset({'max_length', '_log_history', '_count_history'})
_NUMPY_MAX_DIMS = 32


def _same(a: Any, b: Any) -> bool:
    """``a == b`` with the types equal too (``1.0 == 1 == True``)."""
    if type(a) is not type(b):
        return False
    if type(a) is tuple:
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b


def _import(qualified: str) -> Any:
    module, name = qualified.rsplit('.', 1)
    return getattr(importlib.import_module(module), name)


class Name:
    """A name, inert: what ``numpy.ndarray`` and ``OneCycleParamScheduler``
    map to (the file may only pass them on); the dry run's globals
    (:mod:`.scan`)."""
    __slots__ = ('name', )

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


NDARRAY = Name('numpy.ndarray')
ONE_CYCLE_CLASS = Name(ONE_CYCLE)


class _Pending:
    """Made by a builder while torch unpickles; ``value`` is the real
    object once its state is validated (arrays, dtypes, buffers: by BUILD)."""
    __slots__ = ('value', )
    __hash__ = None  # never a dict key or set member (neither are arrays)
    WHAT = ''

    def __new__(cls):
        return super().__new__(cls)

    def built(self) -> Any:
        if not hasattr(self, 'value'):
            raise Refused(f'it uses a {self.WHAT} whose state it never set')
        return self.value

    def _set(self, value: Any) -> None:
        if hasattr(self, 'value'):
            raise Refused(f'it sets the state of a {self.WHAT} twice')
        self.value = value


class _PendingDtype(_Pending):
    __slots__ = ('spec', )
    WHAT = 'numpy dtype'

    def __setstate__(self, state: Any) -> None:
        itemsize = np.dtype(self.spec).itemsize
        orders = ('|', ) if itemsize == 1 else ('<', '>')
        if not (type(state) is tuple and len(state) == 8
                and state[1] in orders and _same(
                    state, (3, state[1], None, None, None, -1, -1, 0))):
            raise Refused(f'numpy.dtype({self.spec!r}) gets the state '
                          f'{brief(state)}: only a plain numeric dtype '
                          f'(version 3, byte order {" or ".join(orders)}, no '
                          'fields, sub-array, size, alignment or flags) is '
                          'admitted')
        self._set(np.dtype(self.spec if itemsize == 1 else state[1] +
                           self.spec))


class _PendingArray(_Pending):
    __slots__ = ()
    WHAT = 'numpy array'

    def __setstate__(self, state: Any) -> None:
        if not (type(state) is tuple and len(state) == 5
                and _same(state[0], 1)):
            raise Refused(f'a numpy array gets the state {brief(state)}: '
                          'expected (1, shape, dtype, fortran, bytes)')
        _, shape, dtype, fortran, raw = state
        if not (type(shape) is tuple and len(shape) <= _NUMPY_MAX_DIMS
                and all(type(n) is int and n >= 0 for n in shape)):
            raise Refused(f'a numpy array has the shape {brief(shape)}')
        if type(dtype) is not _PendingDtype:
            raise Refused(f'a numpy array has the dtype {brief(dtype)}, not '
                          'one built by numpy.dtype')
        dtype = dtype.built()
        count = 1
        for n in shape:
            count *= n
        if type(fortran) is not bool or type(raw) is not bytes or \
                len(raw) != count * dtype.itemsize:
            raise Refused(f'a numpy array of shape {shape} and dtype {dtype} '
                          f'({count * dtype.itemsize} bytes) comes with '
                          f'{brief(len(raw) if type(raw) is bytes else raw)} '
                          'bytes of data')
        try:
            array = np.ndarray(shape, dtype, buffer=bytearray(raw),
                               order='F' if fortran else 'C')
        except ValueError as e:  # e.g. a dimension beyond numpy's limit
            raise Refused(f'a numpy array of shape {brief(shape)} cannot be '
                          f'built: {e}') from None
        # numpy swaps data of the other byte order to native on unpickling
        self._set(array if dtype.isnative else array.astype(
            dtype.newbyteorder('=')))


class _Attribute(_Pending):
    """A function ``getattr`` admitted: ``value`` is set when made."""
    __slots__ = ()
    WHAT = 'function'


class _PendingHistoryBuffer(_Pending):
    """What the name of mmengine's ``HistoryBuffer`` maps to."""
    __slots__ = ()
    WHAT = 'HistoryBuffer'

    def __setstate__(self, state: Any) -> None:
        buffer_class = _import(HISTORY_BUFFER)
        if type(state) is not dict or not (
                _BUFFER_FIELDS <= state.keys() <=
                _BUFFER_FIELDS | {'statistics_methods'}):
            raise Refused(
                f'a HistoryBuffer gets the state {brief(state)}: expected '
                f'the keys {sorted(_BUFFER_FIELDS)} and statistics_methods')
        methods = state.get('statistics_methods', {})
        if type(methods) is not dict or any(
                name not in STATISTICS or type(method) is not _Attribute
                or method.built() is not getattr(
                    buffer_class, name) for name, method in methods.items()):
            raise Refused(
                'a HistoryBuffer comes with the statistics methods '
                f'{brief(methods)}: only {", ".join(STATISTICS)}, each mapped '
                'to the HistoryBuffer method of its name, are admitted')
        length = state['max_length']
        arrays = [state[k] for k in ('_log_history', '_count_history')]
        if type(length) is not int or length < 1 or \
                any(type(a) is not _PendingArray for a in arrays):
            raise Refused('a HistoryBuffer gets a max_length or histories '
                          'that are not a positive int and two numpy arrays')
        log, count = (a.built() for a in arrays)
        if log.ndim != 1 or log.shape != count.shape:
            raise Refused(f'a HistoryBuffer holds histories of shapes '
                          f'{log.shape} and {count.shape}, not two 1-D '
                          'arrays of one length')
        buffer = object.__new__(buffer_class)
        buffer.__dict__.update(max_length=length, _log_history=log,
                               _count_history=count)
        buffer._set_default_statistics()  # fills missing defaults only
        self._set(buffer)


def _numpy_dtype(spec: Any, align: Any, copy: Any) -> _PendingDtype:
    if not (type(spec) is str and spec in NUMPY_DTYPES
            and _same((align, copy), (False, True))):
        raise Refused(f'it builds numpy.dtype{brief((spec, align, copy))}: '
                      f'only {", ".join(sorted(NUMPY_DTYPES))} are admitted')
    dtype = _PendingDtype()
    dtype.spec = spec
    return dtype


def _numpy_reconstruct(cls: Any, shape: Any, typecode: Any) -> _PendingArray:
    if cls is not NDARRAY or not _same((shape, typecode), ((0, ), b'b')):
        raise Refused('it calls numpy _reconstruct'
                      f'{brief((cls, shape, typecode))}: only '
                      "(numpy.ndarray, (0,), b'b') is admitted")
    return _PendingArray()


def _numpy_scalar(dtype: Any, data: Any) -> Any:
    if type(dtype) is not _PendingDtype:
        raise Refused(f'it calls numpy scalar with the dtype {brief(dtype)}')
    dtype = dtype.built()
    if type(data) is not bytes or len(data) != dtype.itemsize:
        raise Refused(f'it builds a numpy {dtype} scalar from {brief(data)}')
    return np.frombuffer(data, dtype)[0]


def _empty_bytes(*args: Any) -> bytes:
    """``bytes()``, as protocol 2 pickles ``b''`` (an empty array's data)."""
    if args:
        raise Refused(f'it calls builtins.bytes{brief(args)} (only bytes() '
                      'is admitted)')
    return b''


def _getattr(owner: Any, name: Any) -> _Attribute:
    """``getattr`` as admitted: a statistics method of ``HistoryBuffer`` or
    an annealing function of ``OneCycleParamScheduler``."""
    if owner is _PendingHistoryBuffer and name in STATISTICS:
        qualified = HISTORY_BUFFER
    elif owner is ONE_CYCLE_CLASS and name in ANNEALING:
        qualified = ONE_CYCLE
    else:
        what = 'HistoryBuffer' if owner is _PendingHistoryBuffer else owner
        raise Refused(f'it calls builtins.getattr({brief(what)}, '
                      f'{brief(name)})')
    attribute = _Attribute()
    attribute._set(getattr(_import(qualified), name))
    return attribute


# name in the file -> what torch's unpickler gets for it
NAMED = {
    **{
        f'{module}.multiarray.{name}': builder
        for module in ('numpy.core', 'numpy._core')  # numpy 1, numpy 2
        for name, builder in (('_reconstruct', _numpy_reconstruct),
                              ('scalar', _numpy_scalar))
    },
    'numpy.ndarray': NDARRAY,
    'numpy.dtype': _numpy_dtype,
    HISTORY_BUFFER: _PendingHistoryBuffer,
    'builtins.getattr': _getattr,
    'builtins.bytes': _empty_bytes,
    ONE_CYCLE: ONE_CYCLE_CLASS,
    'argparse.Namespace': argparse.Namespace,
    'builtins.frozenset': frozenset,
}
# BUILD needs the type of its target admitted; under a name no pickle can
# spell (a GLOBAL's module and name never hold a newline)
_BUILT_ONLY = (_PendingDtype, _PendingArray)
ENTRIES = [(obj, name) for name, obj in NAMED.items()] + [
    (cls, f'{__name__}\n{cls.__name__}') for cls in _BUILT_ONLY
]
_LOCK = threading.Lock()


@contextlib.contextmanager
def admitted():
    """:data:`ENTRIES` in torch's safe globals for the ``with`` block (one
    load at a time: another thread's exit would remove them mid-load);
    entries the user had added stay."""
    with _LOCK:
        present = set(torch.serialization.get_safe_globals())
        with torch.serialization.safe_globals(
            [e for e in ENTRIES if e not in present]):
            yield


_WALKED = (dict, OrderedDict, list, tuple, argparse.Namespace)


def resolve(obj: Any) -> Any:
    """``obj`` with every pending object replaced by what it built, in the
    containers a checkpoint holds (dicts, lists, tuples, ``Namespace``);
    containers are updated in place, tuples rebuilt."""
    done = {}

    def walk(x):
        if id(x) in done:
            return done[id(x)]
        if isinstance(x, _Pending):
            done[id(x)] = x.built()
            return done[id(x)]
        if isinstance(x, Name):
            raise Refused(f'it places {x} where checkpoints never hold it')
        if type(x) not in _WALKED:
            return x
        done[id(x)] = x
        if type(x) is tuple:
            items = tuple(walk(v) for v in x)
            if any(a is not b for a, b in zip(items, x)):
                done[id(x)] = items
            return done[id(x)]
        items = vars(x) if type(x) is argparse.Namespace else x
        keys = range(len(items)) if type(x) is list else list(items)
        for key in keys:
            value = walk(items[key])
            if value is not items[key]:
                items[key] = value
        return x

    try:
        return walk(obj)
    except RecursionError:
        raise Refused('its containers are nested too deeply') from None
