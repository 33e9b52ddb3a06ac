"""Counting the work a call launches: ATen ops, Triton kernels, host syncs.

PyTorch only (no mmseg, mmengine or mmcv); importable without triton.

What is counted, per stage (the forward, then the backward of a given
upstream gradient):

* **ATen launches**: the ATen ops a :class:`TorchDispatchMode` sees (after
  autograd and the composite decompositions: the leaf ops that reach a
  device kernel), except those that launch nothing: views and other
  aliases (``func.is_view``: ``view``, ``transpose``, ``expand``,
  ``as_strided``, ``detach``...), allocations without a fill (``empty``,
  ``empty_strided``...) and metadata ops (:data:`NOT_LAUNCHES`). One op is
  counted as one launch; on a GPU some launch several kernels, hence the
  profiler's CUDA kernel count (:func:`cuda_kernels`).
* **Triton launches**: every ``kernel[grid](...)`` of a
  ``triton.runtime.jit.JITFunction`` (compiled) or of the interpreter's
  ``InterpretedFunction`` (``TRITON_INTERPRET=1``), counted by wrapping
  their ``run`` (:func:`count_triton_launches`); the ATen ops the
  interpreter runs inside a launch are not counted.
* **Host syncs**: ops that read device data on the host
  (:data:`HOST_SYNCS`: ``_local_scalar_dense``, i.e. ``.item()``,
  ``int(t)``, ``bool(t)``; ``nonzero``; ...) and copies between the host
  and a device.

A dispatch mode does not see inside a ``torch.library.custom_op`` (the op
reaches it as one call): for those the counter runs the op's Python
implementation itself, with the mode active, so that its inner ops are
counted (a custom op registered otherwise counts as one launch).
"""
import contextlib
import importlib.util
from collections import Counter
from typing import Callable, Dict, NamedTuple, Optional, Sequence

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that read device memory on the host (a device synchronisation).
HOST_SYNCS = frozenset({
    'aten::_local_scalar_dense', 'aten::item', 'aten::nonzero',
    'aten::is_nonzero', 'aten::equal', 'aten::masked_select',
    'aten::_unique', 'aten::_unique2', 'aten::unique_dim',
    'aten::unique_consecutive', 'aten::bincount'
})
# Ops that launch no kernel though they are not views.
NOT_LAUNCHES = frozenset({
    'aten::empty', 'aten::empty_like', 'aten::empty_strided',
    'aten::new_empty', 'aten::new_empty_strided', 'aten::_unsafe_view',
    'aten::resize_', 'aten::set_', 'aten::size', 'aten::stride',
    'aten::sym_size', 'aten::sym_stride', 'aten::sym_numel',
    'aten::sym_storage_offset', 'aten::is_same_size', 'aten::result_type',
    'aten::_has_compatible_shallow_copy_type', 'aten::lift_fresh'
})
_COPIES = ('aten::_to_copy', 'aten::copy_', 'aten::to')


def _name(func) -> str:
    return f'{func.namespace}::{func._opname}'


def _devices(args, kwargs) -> set:
    found = set()

    def visit(x):
        if isinstance(x, Tensor):
            found.add(x.device.type)
        elif isinstance(x, (list, tuple)):
            for y in x:
                visit(y)

    visit(list(args) + list(kwargs.values()))
    return found


def is_host_sync(func, args, kwargs, out=None) -> bool:
    """``func`` (an ATen overload) reads device data on the host: an op of
    :data:`HOST_SYNCS`, or a copy between the host and a device (``out``:
    its result, where the target device is not an argument)."""
    name = _name(func)
    if name in HOST_SYNCS:
        return True
    if name in _COPIES:
        devices = _devices(args, kwargs) | _devices((out, ), {})
        devices.update(
            torch.device(d).type for d in (kwargs.get('device'), )
            if d is not None)
        return 'cpu' in devices and len(devices) > 1
    return False


class _TritonLaunches:
    """Wraps ``run`` of triton's JITFunction and InterpretedFunction once;
    counts into the active counters."""
    active = []
    patched = False

    @classmethod
    def install(cls):
        if cls.patched or importlib.util.find_spec('triton') is None:
            return
        from triton.runtime.jit import JITFunction
        classes = [JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction
            classes.append(InterpretedFunction)
        except ImportError:  # pragma: no cover - older triton
            pass
        for klass in classes:
            klass.run = cls._wrap(klass.run)
        cls.patched = True

    @classmethod
    def _wrap(cls, run):
        def counted_run(self, *args, grid, warmup, **kwargs):
            if warmup or not cls.active:
                return run(self, *args, grid=grid, warmup=warmup, **kwargs)
            name = 'triton::' + getattr(self, '__name__', 'kernel')
            for counter in cls.active:
                counter.triton[name] += 1
            with _paused(cls.active):
                return run(self, *args, grid=grid, warmup=warmup, **kwargs)

        counted_run.__wrapped__ = run
        return counted_run


@contextlib.contextmanager
def _paused(counters):
    """Counters ignore ATen ops meanwhile (the interpreter's own copies)."""
    for counter in counters:
        counter.paused += 1
    try:
        yield
    finally:
        for counter in counters:
            counter.paused -= 1


def _custom_op_impl(func, device: str) -> Optional[Callable]:
    """The Python implementation of a ``torch.library.custom_op`` overload
    for ``device`` (None for other ops)."""
    from torch._library.custom_ops import OPDEFS
    opdef = OPDEFS.get(f'{func.namespace}::{func._opname}')
    if opdef is None:
        return None
    return opdef._backend_fns.get(device) or opdef._init_fn


class LaunchCounter(TorchDispatchMode):
    """A dispatch mode that counts ATen launches, host syncs and (through
    :class:`_TritonLaunches`) Triton launches; ``aten``, ``triton`` and
    ``syncs`` are Counters by op name. ``fail_on_sync`` raises
    ``RuntimeError`` at the first host sync instead."""

    def __init__(self, fail_on_sync: bool = False):
        super().__init__()
        self.aten, self.triton, self.syncs = Counter(), Counter(), Counter()
        self.paused = self.depth = 0
        self.fail_on_sync = fail_on_sync

    def __enter__(self):
        if not self.depth:  # not when re-entered for a custom op
            _TritonLaunches.install()
            _TritonLaunches.active.append(self)
        self.depth += 1
        return super().__enter__()

    def __exit__(self, *exc):
        self.depth -= 1
        if not self.depth:
            _TritonLaunches.active.remove(self)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace not in ('aten', 'prims') and not self.paused:
            devices = _devices(args, kwargs) or {'cpu'}
            impl = _custom_op_impl(func, sorted(devices)[-1])
            if impl is not None:  # count its inner ops with the mode on
                with self:
                    return impl(*args, **kwargs)
        out = func(*args, **kwargs)
        if self.paused:
            return out
        name = _name(func)
        if is_host_sync(func, args, kwargs, out):
            if self.fail_on_sync:
                raise RuntimeError(f'host synchronisation: {func}')
            self.syncs[name] += 1
        elif not (func.is_view or name in NOT_LAUNCHES):
            self.launched(name, args, out)
        return out

    def launched(self, name: str, args, out) -> None:
        """One ATen launch of op ``name`` (a hook for subclasses that record
        more)."""
        self.aten[name] += 1


def no_host_sync() -> LaunchCounter:
    """A mode that raises at the first host synchronisation."""
    return LaunchCounter(fail_on_sync=True)


class StageCounts(NamedTuple):
    """One stage's counts: ATen launches, Triton launches, host syncs (each
    a Counter by name) and CUDA kernels (None without the CUDA profiler)."""
    aten: Counter
    triton: Counter
    syncs: Counter
    cuda_kernels: Optional[int]

    @property
    def launches(self) -> int:
        return sum(self.aten.values()) + sum(self.triton.values())

    def as_dict(self) -> dict:
        return dict(launches=self.launches, aten=sum(self.aten.values()),
                    triton=sum(self.triton.values()),
                    host_syncs=sum(self.syncs.values()),
                    cuda_kernels=self.cuda_kernels,
                    aten_ops=dict(self.aten), triton_kernels=dict(self.triton),
                    sync_ops=dict(self.syncs))


def cuda_kernels(fn: Callable[[], object]) -> int:
    """CUDA kernels ``fn()`` launches, from ``torch.profiler`` (CUDA
    activity; memcpy and memset not included)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kinds = ('memcpy', 'memset')
    return sum(1 for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.lower().startswith(kinds))


def _count(fn: Callable[[], object], cuda: bool) -> StageCounts:
    counter = LaunchCounter()
    with counter:
        fn()
    kernels = cuda_kernels(fn) if cuda else None
    return StageCounts(counter.aten, counter.triton, counter.syncs, kernels)


def count_launches(fn: Callable[..., Tensor], inputs: Sequence[Tensor],
                   grad: Optional[Tensor] = None,
                   warmup: bool = True) -> Dict[str, StageCounts]:
    """Counts of ``fn(*inputs)`` (``'forward'``) and of the gradients of
    its output, under ``grad``, with respect to the ``inputs`` that require
    grad (``'backward'``, when any does). A first, uncounted forward and
    backward compiles and autotunes (``warmup``). On CUDA tensors the CUDA
    kernels of each stage are counted too (a second run of the stage)."""
    leaves = [t for t in inputs if t.requires_grad]
    cuda = any(t.is_cuda for t in inputs)

    def forward():
        return fn(*inputs)

    upstream = [grad]

    def backward(out):
        if upstream[0] is None:
            upstream[0] = torch.ones_like(out)
        return torch.autograd.grad(out, leaves, upstream[0])

    if warmup or grad is None:
        out = forward()
        if leaves:
            backward(out)
    counts = dict(forward=_count(forward, cuda))
    if leaves:
        # The graph of one forward, whose backward runs (twice on CUDA).
        out = forward()
        counts['backward'] = _count(lambda: backward(out), False)
        if cuda:
            kernels = cuda_kernels(lambda: backward(forward()))
            kernels -= counts['forward'].cuda_kernels
            counts['backward'] = counts['backward']._replace(
                cuda_kernels=kernels)
    return counts
