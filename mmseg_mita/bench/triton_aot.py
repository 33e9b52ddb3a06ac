"""The Triton backend's launches compiled ahead of time for a chosen GPU,
without one.

:func:`compile_call` runs the backend's own launch code, the custom ops
``mmseg_mita::mita_triton_fwd`` and, through autograd,
``mmseg_mita::mita_triton_bwd`` (the Python implementations, ``_forward``
and ``_backward``; the entry
:func:`~mmseg_mita.ops.triton_backend.mita_triton` adds only the dtype cast
and an autocast guard, which do not run on ``meta`` tensors), on ``meta``
tensors, with a stand-in Triton driver
(:class:`StubDriver`) whose current target is ``GPUTarget('cuda', arch,
32)``. Each ``kernel[grid](...)`` then goes through triton's own
``JITFunction.run``: the same argument specialisation, constexprs,
``num_warps`` and ``num_stages`` as on that GPU, compiled by triton's
compiler and the ptxas of the triton wheel (triton's cache dir is used:
identical compiles hit it), and at the launch the stand-in records it
instead: grid, launch arguments, num_warps, num_stages, shared memory, and
from the cubin (``cuobjdump`` of the wheel) registers, stack and the SASS
(:mod:`.sass`), with the compile time. ATen ops of the call that launch
work (:class:`~.launch_counter.LaunchCounter`'s rule: not views,
allocations or metadata) are recorded too, with their shapes.

Inside :func:`compiling_for` triton's active driver, every JIT function's
per-device cache (so that a compile for one target never serves another),
the cache dir, the compile listener and triton's shared-memory limit at
launch are replaced, and all of them are restored at its exit. Triton's
check of shared memory against the device is lifted there (the driver
reports the target's true limit to the launch code): a kernel that would
not launch is still recorded (:mod:`.kernels` reports whether it fits).

The launch code reads the target, if at all, from
``triton.runtime.driver.active.get_current_target()``; today's picks its
block sizes from the shapes alone.

Triton compiles only when it was imported without ``TRITON_INTERPRET=1``:
:func:`compile_isolated` runs the compiles in a fresh Python process without
it (the tests' process runs the kernels in the interpreter).
"""
import contextlib
import functools
import io
import json
import linecache
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from . import hardware, sass
from .launch_counter import LaunchCounter

DTYPES = dict(bfloat16=torch.bfloat16, float16=torch.float16,
              float32=torch.float32)


class CallShape(NamedTuple):
    """One MiTA call: ``tokens`` = ``extra`` tokens + an H x W patch grid
    (the most square one), ``batch`` x ``heads`` groups, m = ``pool``^2
    landmarks, ``topk`` keys per expert."""
    tokens: int
    batch: int = 1
    heads: int = 6
    head_dim: int = 64
    pool: int = 7
    topk: int = 49
    extra: int = 1

    @property
    def grid(self):
        patches = self.tokens - self.extra
        h = max(d for d in range(1, math.isqrt(patches) + 1)
                if patches % d == 0)
        return h, patches // h

    @property
    def groups(self) -> int:
        return self.batch * self.heads

    def check(self) -> 'CallShape':
        """Itself; ``ValueError`` if its patch grid cannot be pooled."""
        if self.tokens - self.extra < self.pool**2:
            raise ValueError(
                f'tokens={self.tokens}: {self.extra} extra token(s) and a '
                f'patch grid of at least {self.pool} x {self.pool} '
                f'(pool={self.pool}) need tokens >= '
                f'{self.extra + self.pool**2}')
        hgt, wid = self.grid
        if min(hgt, wid) < self.pool:
            raise ValueError(
                f'tokens={self.tokens}: its most square patch grid, {hgt} x '
                f'{wid}, is narrower than pool={self.pool}; choose tokens = '
                f'{self.extra} + H * W with H, W >= {self.pool}')
        return self


def _tool(name: str) -> str:
    from triton import knobs
    return getattr(knobs.nvidia, name).path


@functools.lru_cache(maxsize=None)
def _disassemble(cubin: bytes) -> '_Binary':
    """Registers, stack bytes, SASS text and source lines of a one-kernel
    cubin."""
    with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
        f.write(cubin)
        f.flush()

        def tool(name, *options):
            return subprocess.check_output([_tool(name), *options, f.name],
                                           text=True,
                                           stderr=subprocess.DEVNULL)

        usage = tool('cuobjdump', '-res-usage')
        text = tool('cuobjdump', '-sass')
        lines = sass.source_lines(tool('nvdisasm', '-c', '--print-line-info'))
    fields = dict(
        item.split(':', 1) for line in usage.splitlines()
        if 'REG:' in line for item in line.split())
    return _Binary(int(fields['REG']), int(fields['STACK']), text, lines)


def _ptxas_report(log: str) -> Optional[dict]:
    """Registers, stack frame and spill bytes from a ``ptxas -v`` log."""
    found = re.search(
        r'(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes '
        r'spill loads\s+ptxas info\s+: Used (\d+) registers', log)
    if found is None:
        return None
    stack, stores, loads, registers = map(int, found.groups())
    return dict(registers=registers, stack=stack, spill_store_bytes=stores,
                spill_load_bytes=loads)


class _Binary(NamedTuple):
    """What ``load_binary`` hands the launcher as the kernel's function."""
    registers: int
    stack: int
    sass: str
    lines: Dict[int, Tuple[str, int]]  # address -> source file, line


class _Utils:
    """``driver.active.utils`` of the stand-in: the device's properties and
    loading a cubin (here: reading its resources and SASS)."""

    def __init__(self, facts: hardware.Arch):
        self.facts = facts

    def get_device_properties(self, device) -> dict:
        part = hardware.PARTS[hardware.REFERENCE_PART[self.facts.arch]]
        return dict(max_shared_mem=self.facts.smem_per_block,
                    max_num_regs=self.facts.registers_per_sm,
                    multiprocessor_count=part.sms, warpSize=32)

    def load_binary(self, name, cubin, shared, device):
        binary = _disassemble(cubin)
        warps = self.facts.registers_per_sm // hardware.registers_per_warp(
            self.facts, binary.registers)
        return (None, binary, binary.registers, binary.stack // 4,
                min(1024, warps * 32))


class _Launcher:
    """``driver.active.launcher_cls``: records each launch of one compiled
    kernel instead of launching it."""

    def __init__(self, recorder: 'Recorder', src, metadata):
        self.recorder, self.src, self.metadata = recorder, src, metadata

    def __call__(self, grid_x, grid_y, grid_z, stream, function, packed,
                 launch_metadata, enter_hook, exit_hook, *args):
        self.recorder.triton_launch(self.src, self.metadata,
                                    (grid_x, grid_y, grid_z), function, args)


class StubDriver:
    """A Triton driver for a GPU that is not there: current target
    ``GPUTarget('cuda', arch, 32)``, device 0, stream 0; binaries are read,
    never loaded; launches are recorded by ``recorder``."""

    def __init__(self, arch: int, recorder: 'Recorder'):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget('cuda', arch, 32)
        self.utils = _Utils(hardware.arch(arch))
        self.launcher_cls = functools.partial(_Launcher, recorder)

    @staticmethod
    def is_active():
        return False

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device('meta')

    def map_python_to_cpp_type(self, ty: str) -> str:
        from triton.backends.nvidia.driver import ty_to_cpp
        return ty_to_cpp(ty)

    def get_benchmarker(self):
        raise RuntimeError('nothing runs on a stand-in driver')


def _source(where) -> Optional[str]:
    """``file:line: code`` of a SASS loop's backward branch (None without
    line info)."""
    if where is None:
        return None
    path, line = where
    code = linecache.getline(path, line).strip()
    return f'{os.path.basename(path)}:{line}: {code}'


def _describe(value):
    """A launch argument as JSON: scalars as they are, tensors by dtype and
    shape."""
    if isinstance(value, torch.Tensor):
        return dict(dtype=str(value.dtype).replace('torch.', ''),
                    shape=list(value.shape))
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return str(value)


class Recorder(LaunchCounter):
    """Every launch of a call, in order: Triton kernels (from the stand-in
    driver's launcher) and ATen ops (as the launch counter sees them), each
    tagged with the current ``stage``."""

    def __init__(self):
        super().__init__()
        self.launches: List[dict] = []
        self.compiles: Dict[str, dict] = {}
        self.ptxas_log = io.StringIO()
        self.stage = 'forward'

    def launched(self, name, args, out) -> None:
        super().launched(name, args, out)
        outs = out if isinstance(out, (list, tuple)) else (out, )
        self.launches.append(
            dict(kind='aten', name=name, stage=self.stage,
                 inputs=[_describe(a) for a in args
                         if isinstance(a, torch.Tensor)],
                 outputs=[_describe(t) for t in outs
                          if isinstance(t, torch.Tensor)]))

    def compiled(self, *, src, metadata, metadata_group, times, cache_hit):
        """triton's compile listener; ptxas's report (``ptxas -v``, printed
        by triton into :attr:`ptxas_log`) is read back for a new compile."""
        report = self.ptxas_log.getvalue()
        self.ptxas_log.seek(0)
        self.ptxas_log.truncate()
        self.compiles[metadata['hash']] = dict(
            seconds=times.total / 1e6, cache_hit=cache_hit,
            ptxas=None if cache_hit else _ptxas_report(report))

    def triton_launch(self, src, metadata, grid, binary: _Binary, args):
        names = src.fn.arg_names
        self.launches.append(
            dict(kind='triton', name=metadata.name, stage=self.stage,
                 grid=list(grid), num_warps=metadata.num_warps,
                 num_stages=metadata.num_stages, shared=metadata.shared,
                 registers=binary.registers, stack=binary.stack,
                 args={n: _describe(a) for n, a in zip(names, args)},
                 compile=self.compiles.pop(metadata.hash, None),
                 regions=[r.as_dict() for r in sass.profile(binary.sass)],
                 loops=[_source(binary.lines.get(last))
                        for _, last in sass.loops(sass.parse(binary.sass))],
                 sass=binary.sass))


def _jit_functions(jit) -> list:
    """Every JIT function whose per-device cache a compile may fill:
    triton's registry of them (triton >= 3.7), else the backend's kernels
    (triton 3.6 keeps no registry; helpers they call are inlined)."""
    registry = getattr(jit, '_triton_jit_function_registry', None)
    if registry is not None:
        return list(registry.values())
    from mmseg_mita.ops import triton_backend
    return list(triton_backend.KERNEL_FUNCTIONS)


@contextlib.contextmanager
def compiling_for(arch: int, recorder: Recorder,
                  cache_dir: Optional[str] = None):
    """Triton compiles for ``GPUTarget('cuda', arch, 32)`` and ``recorder``
    records every launch instead (see the module docstring); every global
    changed is restored at exit."""
    from triton import knobs
    from triton.compiler import compiler
    from triton.runtime import jit
    from triton.runtime.driver import driver
    functions = _jit_functions(jit)
    saved_caches = [fn.device_caches for fn in functions]
    saved_driver = driver._active
    saved_limit = compiler.max_shared_mem
    with knobs.compilation.scope(), knobs.cache.scope(), \
            knobs.nvidia.scope(), contextlib.redirect_stdout(
                recorder.ptxas_log):
        knobs.compilation.listener = recorder.compiled
        knobs.nvidia.dump_ptxas_log = True
        if cache_dir is not None:
            knobs.cache.dir = cache_dir
        try:
            driver.set_active(StubDriver(arch, recorder))
            compiler.max_shared_mem = lambda device: 1 << 62
            for fn in functions:
                fn.device_caches = defaultdict(fn.create_binder)
            yield
        finally:
            for fn, caches in zip(functions, saved_caches):
                fn.device_caches = caches
            compiler.max_shared_mem = saved_limit
            driver.set_active(saved_driver)


def compile_call(arch: int, shape: CallShape, dtype: str,
                 cache_dir: Optional[str] = None) -> List[dict]:
    """Every launch of one forward and backward of the Triton backend at
    ``shape`` in ``dtype``, compiled for ``arch`` (see the module
    docstring), in call order, each tagged ``stage`` 'forward' or
    'backward'."""
    from mmseg_mita.ops import triton_backend
    from mmseg_mita.ops.plan import pooled_tokens
    if triton_backend.interpreted():
        raise RuntimeError('triton was imported with TRITON_INTERPRET=1: '
                           'use compile_isolated (a process without it)')
    hgt, wid = shape.check().grid
    size = (shape.batch, shape.heads, shape.tokens, shape.head_dim)
    q, k, v = (torch.empty(size, dtype=DTYPES[dtype], device='meta',
                           requires_grad=True) for _ in range(3))
    recorder = Recorder()
    with compiling_for(arch, recorder, cache_dir), recorder:
        out = triton_backend.mita_triton_fwd(
            q, k, v, hgt, wid, pooled_tokens(shape.extra, 'patches'),
            shape.pool, shape.pool, shape.topk, None, None)[0]
        recorder.stage = 'backward'
        torch.autograd.grad(out, (q, k, v), torch.empty_like(out))
    return recorder.launches


class Case(NamedTuple):
    arch: int
    dtype: str
    shape: CallShape


def _worker(request_path: str) -> None:
    """Compiles the cases of a JSON request (``cases``, ``cache_dir``,
    ``sass``) and writes the results to its ``output``."""
    with open(request_path) as f:
        request = json.load(f)
    results = []
    for arch, dtype, shape in request['cases']:
        start = time.perf_counter()
        launches = compile_call(arch, CallShape(*shape), dtype,
                                request['cache_dir'])
        if not request['sass']:
            for launch in launches:
                launch.pop('sass', None)
        results.append(
            dict(arch=arch, dtype=dtype, shape=CallShape(*shape)._asdict(),
                 seconds=time.perf_counter() - start, launches=launches))
    with open(request['output'], 'w') as f:
        json.dump(results, f)


def compile_isolated(cases: Sequence[Case], cache_dir: Optional[str] = None,
                     keep_sass: bool = False, workers: int = 1,
                     timeout: Optional[float] = None) -> List[dict]:
    """:func:`compile_call` of every case in fresh Python processes without
    ``TRITON_INTERPRET`` (at most ``workers`` at a time, the cases of one
    arch in the same one; one triton cache: ``cache_dir``, else triton's
    default). Returns one dict per case, in order: ``arch``, ``dtype``,
    ``shape``, ``seconds``, ``launches`` (the SASS text of each Triton launch
    only with ``keep_sass``)."""
    if workers < 1:
        raise ValueError(f'workers={workers}: give 1 or more processes')
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    env['PYTHONPATH'] = os.pathsep.join(
        [root] + [p for p in [env.get('PYTHONPATH')] if p])
    archs = sorted({c.arch for c in cases})
    shares = [[i for i, c in enumerate(cases)
               if archs.index(c.arch) % workers == w]
              for w in range(min(workers, len(archs)))]
    results = [None] * len(cases)
    with tempfile.TemporaryDirectory() as tmp:
        running = []
        for w, share in enumerate(shares):
            request = os.path.join(tmp, f'request{w}.json')
            with open(request, 'w') as f:
                json.dump(dict(cases=[[cases[i].arch, cases[i].dtype,
                                       list(cases[i].shape)] for i in share],
                               cache_dir=cache_dir, sass=keep_sass,
                               output=os.path.join(tmp, f'output{w}.json')),
                          f)
            log = open(os.path.join(tmp, f'log{w}.txt'), 'w+')
            running.append((subprocess.Popen(
                [sys.executable, '-c', 'import sys; from mmseg_mita.bench.'
                 'triton_aot import _worker; _worker(sys.argv[1])', request],
                stdout=subprocess.DEVNULL, stderr=log, env=env), log))
        try:
            for w, (proc, log) in enumerate(running):
                if proc.wait(timeout=timeout):
                    log.seek(0)
                    raise RuntimeError('compiling failed:\n' +
                                       log.read()[-6000:])
                with open(os.path.join(tmp, f'output{w}.json')) as f:
                    for i, result in zip(shares[w], json.load(f)):
                        results[i] = result
        finally:
            for proc, log in running:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                log.close()
    return results
