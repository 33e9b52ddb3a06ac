"""Static cost model of the fused Triton kernels: resources, occupancy,
roofline and an estimate from their SASS, per GPU target and shape.

Every launch of one forward and backward (:mod:`.triton_aot`: the
backend's own launch code, compiled for ``sm_80``, ``sm_89``, ``sm_90``
without a GPU) is reported with its registers, spills, shared memory,
resident blocks per SM (:func:`~.hardware.blocks_per_sm`), grid and waves
on the reference part of its architecture (A100, RTX 4090, H200). On the
H200 (``sm_90`` code) each launch is also timed by two models:

* **Roofline**: ``max(bytes / 4.8 TB/s, FLOPs / peak)``, with the bytes and
  FLOPs the kernel must move and compute: every tensor it needs read once
  and every output written once, matmul FLOPs (2 per multiply-add; the
  bin sums of the pooling as 1 per element). The formulas are the
  ``bytes`` and ``flops`` of its entry in :data:`KERNELS`, from its launch
  arguments; ATen ops move their inputs and outputs once (factories and
  fills only their outputs), no FLOPs. The peak is dense bf16 / fp16
  (tensor cores) or fp32 (IEEE products) of :data:`~.hardware.TIMED_PART`.
* **Estimate** from the SASS (Triton kernels; an ATen op's estimate is its
  roofline): per program, the instructions its warps issue = the static
  instruction count of each SASS loop nest (:mod:`.sass`) times the trip
  counts of its loops (``trips`` of its entry, from the launch arguments,
  in SASS address order: the kernel's source order). Programs are spread
  over the SMs; the busiest SM runs ``ceil(programs / SMs)`` of them, each
  needing the largest of: issue (4 schedulers, one warp instruction per
  clock each), tensor cores (its HMMA/HGMMA multiply-adds at
  ``mma_per_clock``) and spills (``LDL``/``STL`` bytes at
  :data:`L1_BYTES_PER_CLOCK`), and at least its instructions per warp for
  each round of resident blocks (a warp issues at most one instruction a
  clock: what bounds a program of fewer warps than schedulers); each
  GPU-scope fence (``MEMBAR.*.GPU``,
  serialising its warp) adds :data:`FENCE_CYCLES` once per round of
  resident blocks (the occupancy found). Memory: the roofline's bytes plus
  atomics (read and written: 2 x their bytes) over HBM bandwidth, scaled by
  the share of SMs that have a program (a grid below one wave does not
  reach full bandwidth). The estimate is the larger of the SM time (at
  :attr:`~.hardware.Part.clock_hz`) and the memory time.

What the estimate leaves out (it is a static model, not a measurement):
latency (a warp is assumed to issue every clock: kernels with few warps
per scheduler are slower), branches (every instruction of a loop body runs
every trip, both sides of a branch included), caches (L2 hits cost like
HBM; spills hit L1), launch latency and the host. Programs whose block has
no expert return at once and cost nothing (``programs``: routing assumed
balanced, N / m queries per expert). Loop trip counts of a program whose
trips vary (``_pool``'s bin patches, ``_merge``'s expert and split work)
are their mean.

Full attention at the same shape, what exact attention must do (a lower
bound, at the same peak; its forward+backward is the sum of the two
stages' rooflines, as dO only exists once the forward has ended). Per
head, forward: ``S = Q K^T`` and ``O = P V``, 2 matmuls of 2 N^2 d FLOPs;
reads q, k, v, writes o and the log-sum-exp of each row (float32, what
the backward needs to rebuild P). Backward: ``dV = P^T dO``, ``dP = dO
V^T``, ``dQ = dS K``, ``dK = dS^T Q`` (4 matmuls) and P itself, either
recomputed (``Q K^T`` again: 2 d FLOPs an entry) or stored by the forward
and read back (at least 2 + 2 bytes an entry in 16 bits); recomputing is
the cheaper for ``d < 2 x peak / bandwidth`` (412 on the H200: every
head_dim up to 128), so the bound is 5 matmuls, 2.5 times the forward's
FLOPs (what FlashAttention-2 and -3 do); reads q, k, v, o (for ``rowsum(dO
* O)``), dO and the log-sum-exp, writes dq, dk, dv.

:data:`TARGETS` are checked on the H200, forward+backward.
"""
import argparse
import math
import os
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

from . import hardware, sass
from .cli import UsageError
from .record import document, finish
from .report import Column, format_table
from .triton_aot import DTYPES, CallShape, Case, compile_isolated

SCHEDULERS = 4  # warp schedulers per SM, one instruction per clock each
L1_BYTES_PER_CLOCK = 128  # per SM: local memory (spills) hits L1
FENCE_CYCLES = 500  # one GPU-scope fence: about a global memory round trip
# Static SASS counts reported per launch (ptxas's spill bytes, per thread).
STATIC_FIELDS = ('spill_store_bytes', 'spill_load_bytes', 'gpu_fences',
                 'l1_invalidations', 'atomics')
ELEMENT_BYTES = dict(bfloat16=2, float16=2, float32=4, int64=8, int32=4,
                     bool=1, uint8=1)


def cdiv(a: float, b: float) -> int:
    return -(-int(a) // int(b))


class Args:
    """A launch's arguments by name (``a.n``, ``a.BLOCK_N``), its grid, its
    groups ``a.G`` (grid axis 0: batch x heads) and ``a.size(name)``, the
    element size of a tensor argument."""

    def __init__(self, launch: dict):
        self._args, self.grid = launch['args'], launch['grid']
        self.G = self.grid[0]

    def __getattr__(self, name: str):
        try:
            return self._args[name]
        except KeyError:
            raise AttributeError(name) from None

    def size(self, name: str) -> int:
        return ELEMENT_BYTES[self._args[name]['dtype']]


class KernelModel(NamedTuple):
    """What a kernel must move and compute and how often its loops run, as
    functions of its launch :class:`Args`."""
    trips: Callable[[Args], List[float]]  # per SASS loop, in address order
    bytes: Callable[[Args], float]
    flops: Callable[[Args], float]
    # Programs that do the work (the others return at once); all by default.
    programs: Optional[Callable[[Args], float]] = None
    # The share of its atomics' lanes that are live (a masked lane moves no
    # bytes: padding rows and head dims); 1 by default.
    atomic_share: Optional[Callable[[Args], float]] = None


def _bin_sizes(a: Args) -> List[int]:
    """Patches in each adaptive-pooling bin (PyTorch's bins, which may
    overlap: bin i of an axis of L in p is [floor(i L / p), ceil((i + 1) L /
    p)))."""

    def lengths(size, bins):
        return [-(-(i + 1) * size // bins) - i * size // bins
                for i in range(bins)]

    return [r * c for r in lengths(a.hgt, a.ph) for c in lengths(a.wid, a.pw)]


def _routed_rows(a: Args) -> int:
    """Distinct keys the experts of a group route to (at most)."""
    return min(a.n, a.m * a.k)


def _live_tiles(a: Args) -> int:
    """Tiles of ``BLOCK_M`` slots of a group that hold a query, when every
    expert gets N / m queries (an expert's queries fill its slots first)."""
    return min(a.slots_per_group // a.BLOCK_M,
               a.m * cdiv(cdiv(a.n, a.m), a.BLOCK_M))


def _expert_programs(a: Args) -> int:
    """Programs of ``_experts_fwd`` (a tile of ``BLOCK_M`` slots each) whose
    slots hold a query (the others return at once)."""
    return a.G * _live_tiles(a)


def _bwd_tiles(a: Args) -> float:
    """Tiles holding queries per program of ``_experts_bwd`` (its programs
    share a group's tiles out, every ``grid[1]``-th; a tile of no query
    skips the loop's body)."""
    return _live_tiles(a) / a.grid[1]


def _bwd_trips(a: Args) -> List[float]:
    """``_experts_bwd``'s loops: the program's tiles of queries and, in
    each, the compressed keys' tiles (unless they are all one tile, summed
    over the program: ``SUM_LANDMARKS``) and the routed keys' tiles."""
    compressed = [] if a.SUM_LANDMARKS else [cdiv(a.m, a.BLOCK_N)]
    return [_bwd_tiles(a)] + compressed + [cdiv(a.k, a.BLOCK_N)]


def _bwd_atomic_share(a: Args) -> float:
    """The live share of ``_experts_bwd``'s atomics: per tile of queries,
    the routed keys' dk, dv (``k`` rows in tiles of ``BLOCK_N``) and,
    unless summed over the program, dR and dVt (``m`` rows in tiles of
    ``BLOCK_N``); if summed, dR and dVt per program (``m`` rows of
    ``M_PAD``)."""
    if not a.SUM_LANDMARKS:
        return _live_share(a, [a.m, a.k], a.BLOCK_N)
    tiles = _bwd_tiles(a)
    full = tiles * cdiv(a.k, a.BLOCK_N) * a.BLOCK_N + a.M_PAD
    return (tiles * a.k + a.m) / full * a.d / a.BLOCK_D


def _live_share(a: Args, rows: Sequence[int], tile: int) -> float:
    """The share of an atomic's lanes that are live when each loop adds
    ``rows`` rows (of d columns) in tiles of ``tile`` rows (of ``BLOCK_D``
    columns), the same bytes per trip: masked lanes move no bytes."""
    return (sum(rows) / sum(cdiv(r, tile) * tile for r in rows) * a.d /
            a.BLOCK_D)


def _layout_bytes(a: Args) -> int:
    """The block layout (slots and block experts, int32) of a group."""
    return (a.slots_per_group + a.num_blocks) * 4


def _split_bytes(a: Args, splits: int) -> int:
    """What the keys pass hands the merge per group in its splits: each
    split's partial softmax (float32 output and log-sum-exp per landmark)
    and counts per expert (int32)."""
    return splits * (a.m * (a.d + 1) * 4 + a.M_PAD * 4)


def _chunks(a: Args) -> int:
    """Chunks of ``2**LOG_C`` tokens of the fused top-k, per landmark."""
    return cdiv(a.n, 2**a.LOG_C)


def _groups(a: Args) -> int:
    """Groups of ``2**LOG_G`` chunks, per landmark."""
    return cdiv(_chunks(a), 2**a.LOG_G)


def _chunk_bytes(a: Args) -> int:
    """The chunk maxima of a group, and those of its groups of chunks if a
    group holds several (int32; when the top-k is fused)."""
    if not a.FUSED_TOPK:
        return 0
    return a.m * (_chunks(a) + (_groups(a) if a.LOG_G else 0)) * 4


def _candidate_rows(a: Args) -> int:
    """Distinct keys whose logits the merge recomputes in a group (at
    most): the tokens of each landmark's ``K_PAD`` best chunks."""
    if not a.FUSED_TOPK or not a.LOG_C:  # chunks of one token: none
        return 0
    return min(a.n, a.m * min(_chunks(a), 2**a.LOG_K) * 2**a.LOG_C)


def _merge_trips(a: Args) -> List[float]:
    """``_merge``'s loops, per program on average (programs below m merge an
    expert, those below S sort a split's queries): the split tiles of the
    shared expert (2); when fused, the top-k's folds: of the chunk groups'
    maxima, ``K_PAD`` at a time (a last, partial tile apart), of the
    chunks of the best groups (if a group has several) and of the tokens
    of the best chunks; the counts,
    the expert's block and slot fills (the last expert's fills too, once
    in m programs), the expert tiles of the sort, their counts and ids."""
    experts = a.m / a.grid[1]
    sorts = a.splits / a.grid[1]
    tiles = cdiv(a.splits, 2**a.LOG_S) * experts
    topk = []
    if a.FUSED_TOPK:
        tiles_k = (_groups(a) // 2**a.LOG_K if a.LOG_REST >= 0 else
                   cdiv(_groups(a), 2**a.LOG_K))
        topk = ([tiles_k * experts] +
                ([2**a.LOG_G * experts] if a.LOG_G else []) +
                ([2**a.LOG_C * experts] if a.LOG_C else []))
    return [tiles, tiles] + topk + [
        tiles, experts, experts, 1 / a.grid[1], 1 / a.grid[1],
        cdiv(a.m, 2**a.LOG_E) * sorts,
        cdiv(a.splits, 2**a.LOG_S),
        cdiv(a.chunk, 32 * a.ROWS)
    ]


# The per-kernel knowledge of the model, one entry per Triton kernel
# (``e`` = element bytes of q; per group: n tokens, m landmarks, k routed
# keys, d head dims, P = hgt * wid patches, S splits of the keys pass).
KERNELS: Dict[str, KernelModel] = {
    # Loop: the patches of the landmark's bin. Reads them; writes R.
    '_pool': KernelModel(
        trips=lambda a: [
            sum(cdiv(size, a.BLOCK_P) for size in _bin_sizes(a)) / a.m],
        bytes=lambda a: a.G * (a.hgt * a.wid + a.m) * a.d * a.size('Q'),
        flops=lambda a: a.G * a.hgt * a.wid * a.d),
    # Loops: the landmark tiles and, in each, the split's key tiles; the
    # split's query tiles and, in each, the landmark tiles of the routing.
    # Reads q, K, V and R; writes the experts of the queries, what the
    # merge reads and the chunk maxima (or R K^T, float32, when k is too
    # large to fuse).
    '_keys': KernelModel(
        trips=lambda a: [
            cdiv(a.m, 2**a.LOG_L), a.n / a.grid[1] / 2**a.LOG_N,
            a.n / a.grid[1] / a.BLOCK_Q, cdiv(a.m, a.E_TILE)],
        bytes=lambda a: a.G * (
            (3 * a.n + a.m) * a.d * a.size('Q') + a.n * 4 +
            _split_bytes(a, a.grid[1]) + _chunk_bytes(a) +
            (a.m * a.n * 4 if a.STORE_LOGITS else 0)),
        flops=lambda a: a.G * 6 * a.m * a.n * a.d),
    # Loops: see _merge_trips. Reads the splits' partials and counts, the
    # experts of the queries, the chunk maxima, R and the keys of the best
    # chunks (when fused); writes Vt, its lse, the top-k rows and the block
    # layout. FLOPs: the candidates' logits (a landmark a product).
    '_merge': KernelModel(
        trips=_merge_trips,
        bytes=lambda a: a.G * (
            _split_bytes(a, a.splits) + a.n * 4 + a.m * a.d * a.size('VT') +
            a.m * 4 + _chunk_bytes(a) +
            ((a.m + _candidate_rows(a)) * a.d * a.size('K')
             if _candidate_rows(a) else 0) +
            a.m * a.k * a.size('TOPK') + _layout_bytes(a)),
        flops=lambda a: a.G * 2 * a.d * _candidate_rows(a)),
    # Loops: the compressed keys, the routed keys. Reads q, R, Vt, the top-k
    # rows, the routed keys and values, the layout; writes o and its lse.
    '_experts_fwd': KernelModel(
        trips=lambda a: [cdiv(a.m, a.BLOCK_N), cdiv(a.k, a.BLOCK_N)],
        bytes=lambda a: a.G * (
            (2 * a.n + 2 * a.m + 2 * _routed_rows(a)) * a.d * a.size('Q') +
            a.m * a.k * a.size('TOPK') + _layout_bytes(a) + a.n * 4),
        flops=lambda a: a.G * 4 * a.n * (a.m + a.k) * a.d,
        programs=_expert_programs),
    # Loops: see _bwd_trips. Reads q, o, dO, lse and what the forward read;
    # writes dq (float32), adds the routed dk, dv per tile and dR, dVt per
    # tile or per program (float32).
    '_experts_bwd': KernelModel(
        trips=_bwd_trips,
        bytes=lambda a: a.G * (
            (3 * a.n + 2 * a.m + 2 * _routed_rows(a)) * a.d * a.size('Q') +
            a.n * 4 + a.m * a.k * a.size('TOPK') + _layout_bytes(a) +
            (a.n + 2 * _routed_rows(a) + 2 * a.m) * a.d * a.size('DQ_ACC')),
        flops=lambda a: a.G * 10 * a.n * (a.m + a.k) * a.d,
        atomic_share=_bwd_atomic_share),
    # Loop: the landmarks. Reads K, V, R, Vt, their lse, dVt and the routed
    # dk, dv sums; writes dk, dv and adds dR.
    '_shared_bwd': KernelModel(
        trips=lambda a: [cdiv(a.m, a.BLOCK_L)],
        bytes=lambda a: a.G * (
            (4 * a.n + 2 * a.m) * a.d * a.size('K') + a.m * 4 +
            (2 * a.n + 2 * a.m) * a.d * a.size('DK_ACC')),
        flops=lambda a: a.G * 10 * a.m * a.n * a.d,
        atomic_share=lambda a: _live_share(a, [a.m], a.BLOCK_L)),
    # No loop: the (at most 2 x 2) bins of a patch, gathered. Reads dq
    # (float32) and dR; writes dq.
    '_pool_bwd': KernelModel(
        trips=lambda a: [],
        bytes=lambda a: a.G * (
            (a.n + a.m) * a.d * a.size('DQ_ACC') + a.n * a.d * a.size('DQ')),
        flops=lambda a: a.G * 4 * a.hgt * a.wid * a.d),
}
# ATen ops whose inputs are read for their shape only.
FACTORIES = frozenset({
    'aten::new_zeros', 'aten::new_ones', 'aten::new_full', 'aten::zeros',
    'aten::zeros_like', 'aten::ones_like', 'aten::full_like', 'aten::zero_',
    'aten::fill_'
})
# The shapes of the report: N x (batch x 6 heads), head_dim 64, m = k = 49.
SHAPES = (CallShape(1025, batch=8), CallShape(4097, batch=2),
          CallShape(65537, batch=1))


class Target(NamedTuple):
    """A requirement on the H200, forward+backward, met when its value is
    at most ``bound``. ``what``: 'kernel_estimate' (the largest ratio of a
    Triton kernel's estimate to its roofline at every shape, over the
    launches whose roofline is ``min_roofline_s`` or more),
    'stage_estimate' (the largest ratio of a stage's summed estimate to its
    summed roofline, forward and backward, at every shape), 'bytes' (the
    pipeline's bytes over the bytes full attention must move at
    ``tokens``), 'roofline' (the pipeline's roofline over full attention's
    at ``tokens``), 'estimate' (the pipeline's estimate over full
    attention's roofline at ``tokens``) or 'estimate_us' (the pipeline's
    estimate at ``tokens``, in microseconds). ``diagnostic``: reported,
    not a target (one the design cannot meet, kept to watch)."""
    key: str
    what: str
    tokens: Optional[int]
    bound: float
    min_roofline_s: float = 0.0
    diagnostic: bool = False


TARGETS = (
    Target('kernel_estimate_within_3x_roofline', 'kernel_estimate', None,
           3.0),
    Target('kernel_estimate_within_2x_roofline_from_5us', 'kernel_estimate',
           None, 2.0, min_roofline_s=5e-6),
    Target('stage_estimate_within_2x_roofline', 'stage_estimate', None, 2.0),
    Target('bytes_1025_vs_attention', 'bytes', 1025, 2.5),
    Target('estimate_1025_us', 'estimate_us', 1025, 90.0),
    Target('estimate_4097_vs_attention_roofline', 'estimate', 4097, 0.40),
    Target('estimate_65537_vs_attention_roofline', 'estimate', 65537, 0.02),
    # The earlier targets: the float32 sums of scattered gradients and the
    # launches of small rooflines keep both out of reach (docs/gpu.md).
    Target('kernel_estimate_within_2x_roofline', 'kernel_estimate', None,
           2.0, diagnostic=True),
    Target('roofline_1025_vs_attention', 'roofline', 1025, 1.0,
           diagnostic=True),
)


def _nbytes(tensor: dict) -> int:
    return math.prod(tensor['shape']) * ELEMENT_BYTES[tensor['dtype']]


def aten_bytes(launch: dict) -> int:
    """Bytes an ATen op moves: its inputs read and outputs written once
    (factories and fills: their outputs)."""
    moved = sum(_nbytes(t) for t in launch['outputs'])
    if launch['name'] not in FACTORIES:
        moved += sum(_nbytes(t) for t in launch['inputs'])
    return moved


def roofline(moved: float, flops: float, dtype: str,
             part: hardware.Part = hardware.TIMED_PART) -> float:
    """Seconds: ``max(bytes / bandwidth, FLOPs / peak)`` on ``part``."""
    return max(moved / part.hbm_bytes_per_s, flops / part.flops[dtype])


def attention_roofline(shape: CallShape, dtype: str, stage: str) -> dict:
    """Full attention's bytes, FLOPs and roofline at ``shape`` (see the
    module docstring) for ``stage`` 'forward', 'backward' or 'total' (the
    sum of the two)."""
    per_tensor = shape.groups * shape.tokens * shape.head_dim * \
        ELEMENT_BYTES[dtype]
    lse = shape.groups * shape.tokens * ELEMENT_BYTES['float32']
    flops = 4 * shape.tokens**2 * shape.head_dim * shape.groups
    stages = dict(forward=(4 * per_tensor + lse, flops),
                  backward=(8 * per_tensor + lse, 2.5 * flops))
    if stage != 'total':
        moved, flops = stages[stage]
        return dict(bytes=moved, flops=flops,
                    roofline_s=roofline(moved, flops, dtype))
    parts = [attention_roofline(shape, dtype, s) for s in stages]
    return {key: sum(p[key] for p in parts) for key in parts[0]}


def model_of(name: str) -> KernelModel:
    if name not in KERNELS:
        raise ValueError(f'kernel {name} has no entry in '
                         'mmseg_mita.bench.kernels.KERNELS: add its trips, '
                         'bytes and flops')
    return KERNELS[name]


def per_program(launch: dict, trips: Sequence[float]) -> dict:
    """Per-warp totals of a program (instructions, atomics, fences, spill
    bytes per thread, multiply-adds by operand type): each SASS region's
    counts times the trip counts of its loops."""
    loops = max((max(r['loops']) + 1 for r in launch['regions']
                 if r['loops']), default=0)
    if loops != len(trips):
        where = ''.join(f'\n  loop {i}: {source}'
                        for i, source in enumerate(launch.get('loops', [])))
        raise ValueError(
            f"{launch['name']}: {loops} loops in its SASS, {len(trips)} trip "
            'counts in mmseg_mita.bench.kernels.KERNELS: update its trips '
            f'(SASS loops in address order, by source line):{where}')
    total, mma = {}, {}
    for region in launch['regions']:
        weight = math.prod(trips[i] for i in region['loops'])
        for field, count in region['counts'].items():
            total[field] = total.get(field, 0) + weight * count
        for kind, fma in region['mma'].items():
            mma[kind] = mma.get(kind, 0) + weight * fma
    total['mma'] = mma
    return total


def estimate(launch: dict, model: KernelModel, moved: float,
             part: hardware.Part = hardware.TIMED_PART) -> dict:
    """The SASS estimate of one Triton launch on ``part`` (see the module
    docstring): ``estimate_s`` (None when a block does not fit), and what
    it is made of."""
    args = Args(launch)
    facts = hardware.arch(part.arch)
    warps = launch['num_warps']
    work = per_program(launch, model.trips(args))
    programs = (model.programs(args)
                if model.programs else math.prod(launch['grid']))
    resident = hardware.blocks_per_sm(facts, warps, launch['registers'],
                                      launch['shared'])
    out = dict(programs=programs, instructions_per_warp=work['instructions'],
               atomics_per_warp=work['atomics'],
               fences_per_warp=work['gpu_fences'], estimate_s=None)
    if not resident:
        return out
    unknown = set(work['mma']) - set(facts.mma_per_clock)
    if unknown:
        raise ValueError(f'{sorted(unknown)} tensor-core operands: add their '
                         'rate to hardware.ARCHS[...].mma_per_clock')
    issue = warps * work['instructions'] / SCHEDULERS
    tensor = sum(warps * fma / facts.mma_per_clock[kind]
                 for kind, fma in work['mma'].items())
    spill = warps * 32 * (work['spill_store_bytes'] +
                          work['spill_load_bytes']) / L1_BYTES_PER_CLOCK
    per_sm = cdiv(programs, part.sms)
    rounds = cdiv(per_sm, resident)
    # A warp issues at most one instruction a clock: a program of fewer
    # warps than schedulers takes at least its instructions per warp.
    cycles = max(per_sm * max(issue, tensor, spill),
                 rounds * work['instructions']) + (
                     rounds * work['gpu_fences'] * FENCE_CYCLES)
    share = model.atomic_share(args) if model.atomic_share else 1.0
    traffic = moved + 2 * programs * warps * work['atomic_bytes'] * share
    busy = min(programs, part.sms) / part.sms
    memory = traffic / (part.hbm_bytes_per_s * busy) if programs else 0.0
    out.update(issue_cycles=issue, tensor_cycles=tensor, spill_cycles=spill,
               sm_s=cycles / part.clock_hz, memory_s=memory,
               estimate_s=max(cycles / part.clock_hz, memory))
    return out


def launch_row(launch: dict, arch: int, dtype: str) -> dict:
    """One launch's report: resources, occupancy and waves on the reference
    part of ``arch``; bytes, FLOPs and roofline on the H200; the estimate
    for ``sm_90`` code."""
    row = dict(name=launch['name'], kind=launch['kind'],
               stage=launch['stage'])
    if launch['kind'] == 'aten':
        moved = aten_bytes(launch)
        seconds = roofline(moved, 0, dtype)
        row.update(bytes=moved, flops=0, roofline_s=seconds,
                   estimate_s=seconds,
                   shapes=[t['shape'] for t in launch['inputs']])
        return row
    facts = hardware.arch(arch)
    part = hardware.PARTS[hardware.REFERENCE_PART[arch]]
    model = model_of(launch['name'])
    args = Args(launch)
    moved, flops = model.bytes(args), model.flops(args)
    static = sass.totals(
        [sass.Region(tuple(r['loops']), r['counts'], r['mma'])
         for r in launch['regions']])
    resident = hardware.blocks_per_sm(facts, launch['num_warps'],
                                      launch['registers'], launch['shared'])
    programs = math.prod(launch['grid'])
    row.update(
        grid=launch['grid'], num_warps=launch['num_warps'],
        num_stages=launch['num_stages'], registers=launch['registers'],
        shared=launch['shared'], fits=launch['shared'] <= facts.smem_per_block,
        blocks_per_sm=resident,
        waves=programs / (resident * part.sms) if resident else None,
        bytes=moved, flops=flops, roofline_s=roofline(moved, flops, dtype),
        **{f: static[f] for f in STATIC_FIELDS})
    if arch == hardware.TIMED_PART.arch:
        row.update(estimate(launch, model, moved))
    return row


def _sum(values):
    values = list(values)
    return None if None in values else sum(values)


def call_report(result: dict) -> dict:
    """One compiled call (:func:`~.triton_aot.compile_isolated`'s dict):
    a row per launch (the call's arch, dtype and shape in each), and per
    stage ('forward', 'backward', 'total') the pipeline's roofline and
    estimate sums beside full attention's."""
    shape = CallShape(**result['shape'])
    context = dict(arch=result['arch'], dtype=result['dtype'],
                   tokens=shape.tokens, batch=shape.batch, heads=shape.heads,
                   head_dim=shape.head_dim)
    rows = [dict(context, **launch_row(launch, result['arch'],
                                       result['dtype']))
            for launch in result['launches']]
    stages = []
    for stage in ('forward', 'backward', 'total'):
        mine = [r for r in rows if stage in ('total', r['stage'])]
        attention = attention_roofline(shape, result['dtype'], stage)
        stages.append(
            dict(context, stage=stage, launches=len(mine),
                 roofline_s=_sum(r['roofline_s'] for r in mine),
                 estimate_s=_sum(r.get('estimate_s') for r in mine),
                 attention_roofline_s=attention['roofline_s'],
                 attention_bytes=attention['bytes'],
                 attention_flops=attention['flops']))
    return dict(rows=rows, stages=stages)


def _target_value(target: Target, rows: List[dict],
                  stages: List[dict]) -> Optional[float]:
    """The value of ``target`` on the timed part's rows and stages (None:
    none at its shape; inf: a launch without an estimate)."""
    if target.what == 'kernel_estimate':
        ratios = [(r['estimate_s'] / r['roofline_s']
                   if r['estimate_s'] is not None else math.inf)
                  for r in rows if r['kind'] == 'triton'
                  and r['roofline_s'] >= target.min_roofline_s]
        return max(ratios) if ratios else None
    if target.what == 'stage_estimate':
        ratios = [(s['estimate_s'] / s['roofline_s']
                   if s['estimate_s'] is not None else math.inf)
                  for s in stages if s['stage'] != 'total']
        return max(ratios) if ratios else None
    found = [s for s in stages
             if s['stage'] == 'total' and s['tokens'] == target.tokens]
    if not found:
        return None
    total = found[0]
    if target.what == 'bytes':
        moved = sum(r['bytes'] for r in rows
                    if r['tokens'] == target.tokens)
        return moved / total['attention_bytes']
    value = total[('estimate' if target.what == 'estimate_us' else
                   target.what) + '_s']
    if value is None:
        return math.inf
    if target.what == 'estimate_us':
        return value * 1e6
    return value / total['attention_roofline_s']


def _target(target: Target, rows: List[dict], stages: List[dict]) -> dict:
    timed = hardware.TIMED_PART.arch
    row = dict(target._asdict(), value=None, met=None, why=None)
    row['value'] = _target_value(
        target, [r for r in rows if r['arch'] == timed],
        [s for s in stages if s['arch'] == timed])
    if row['value'] is None:
        row['why'] = 'no sm_90 call at this shape in the report'
    elif math.isinf(row['value']):
        row['value'], row['why'] = None, 'a kernel does not fit the H200'
    row['met'] = row['value'] is not None and row['value'] <= target.bound
    return row


def report(results: List[dict]) -> dict:
    """The model's report of compiled calls: ``rows`` (one per launch),
    ``stages`` (per call and stage: sums beside full attention), the
    :data:`TARGETS` and the model's constants."""
    rows, stages = [], []
    for result in results:
        call = call_report(result)
        rows += call['rows']
        stages += call['stages']
    part = hardware.TIMED_PART
    return dict(
        rows=rows, stages=stages,
        targets=[_target(t, rows, stages) for t in TARGETS],
        model=dict(timed_part=part._asdict(), clock_hz=part.clock_hz,
                   schedulers=SCHEDULERS,
                   l1_bytes_per_clock=L1_BYTES_PER_CLOCK,
                   fence_cycles=FENCE_CYCLES))


def _us(seconds) -> str:
    return f'{seconds * 1e6:.1f}'


def _shape_of(row: dict) -> str:
    return f"{row['tokens']} x {row['batch'] * row['heads']}"


RESOURCES = [
    Column('target', lambda r: f"sm_{r['arch']}", left=True),
    Column('kernel', 'name', left=True),
    Column('N x BH', _shape_of, left=True),
    Column('grid', lambda r: 'x'.join(map(str, r['grid'])), left=True),
    Column('warps', 'num_warps'),
    Column('regs', 'registers'),
    Column('spill st / ld B', lambda r: f"{r['spill_store_bytes']} / "
           f"{r['spill_load_bytes']}"),
    Column('smem KB', 'shared', lambda v: f'{v / 1024:.1f}'),
    Column('fits', 'fits', lambda v: 'yes' if v else 'NO', left=True),
    Column('blocks/SM', 'blocks_per_sm'),
    Column('waves', 'waves', '{:.2f}'),
    Column('GPU fences', 'gpu_fences'),
    Column('atomics', 'atomics'),
]
TIMES = [
    Column('kernel (H200)', 'name', left=True),
    Column('N x BH', _shape_of, left=True),
    Column('stage', 'stage', left=True),
    Column('MB', 'bytes', lambda v: f'{v / 1e6:.2f}'),
    Column('GFLOP', 'flops', lambda v: f'{v / 1e9:.2f}'),
    Column('roofline us', 'roofline_s', _us),
    Column('estimate us', 'estimate_s', _us),
    Column('estimate / roofline', lambda r: None if r['estimate_s'] is None
           else r['estimate_s'] / r['roofline_s'], '{:.1f}'),
]
CALLS = [
    Column('N x BH (H200)', _shape_of, left=True),
    Column('stage', 'stage', left=True),
    Column('launches', 'launches'),
    Column('MiTA roofline us', 'roofline_s', _us),
    Column('MiTA estimate us', 'estimate_s', _us),
    Column('attention roofline us', 'attention_roofline_s', _us),
    Column('attention roofline / MiTA estimate',
           lambda r: None if r['estimate_s'] is None else
           r['attention_roofline_s'] / r['estimate_s'], '{:.2f}'),
]
GOALS = [
    Column('target', lambda r: r['key'] + (' (diagnostic)'
                                           if r['diagnostic'] else ''),
           left=True),
    Column('value', 'value', '{:.3g}'),
    Column('at most', 'bound', '{:g}'),
    Column('met', lambda r: 'yes' if r['met'] else 'no' + (
        f" ({r['why']})" if r['why'] else ''), left=True),
]


def table(doc: dict, markdown: bool) -> str:
    """The report's tables: resources per target, time per launch on the
    H200, per call, and the targets."""
    timed = hardware.TIMED_PART.arch
    return '\n\n'.join([
        format_table([r for r in doc['rows'] if r['kind'] == 'triton'],
                     RESOURCES, markdown),
        format_table([r for r in doc['rows'] if r['arch'] == timed], TIMES,
                     markdown),
        format_table([s for s in doc['stages'] if s['arch'] == timed],
                     CALLS, markdown),
        format_table(doc['targets'], GOALS, markdown)
    ])


def _shape(text: str) -> CallShape:
    """``N`` or ``N:BATCH``."""
    tokens, _, batch = text.partition(':')
    return CallShape(int(tokens), batch=int(batch or 1))


def _write_sass(results: List[dict], folder: str) -> None:
    for result in results:
        shape = CallShape(**result['shape'])
        arch_dir = os.path.join(folder, f"sm_{result['arch']}")
        os.makedirs(arch_dir, exist_ok=True)
        for launch in result['launches']:
            if launch['kind'] == 'triton':
                name = (f"{launch['name']}.N{shape.tokens}x{shape.groups}."
                        f"{result['dtype']}.sass")
                with open(os.path.join(arch_dir, name), 'w') as f:
                    f.write(launch['sass'])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--archs', type=int, nargs='+', default=[80, 89, 90],
                        choices=sorted(hardware.ARCHS),
                        help='compute capabilities to compile for')
    parser.add_argument('--dtype', default='bfloat16', choices=list(DTYPES))
    parser.add_argument(
        '--shapes', type=_shape, nargs='+', default=list(SHAPES),
        help='N or N:BATCH (N = 1 cls token + an H x W grid)')
    parser.add_argument('--heads', type=int, default=6)
    parser.add_argument('--head-dim', type=int, default=64)
    parser.add_argument('--pool', type=int, default=7,
                        help='m = pool^2 landmarks')
    parser.add_argument('--topk', type=int, default=49)
    parser.add_argument('--cache-dir', help="triton's cache dir")
    parser.add_argument('--workers', type=int, default=1,
                        help='compiling processes (one arch each)')
    parser.add_argument('--sass-dir',
                        help='write the SASS of every Triton launch there '
                        '(SASS_DIR/sm_ARCH/KERNEL.N<tokens>x<groups>.sass)')


def run(args: argparse.Namespace) -> int:
    """Compiles, models, prints the tables (and writes ``--json`` /
    ``--markdown``); exit status 0 (the targets are reported, not
    enforced)."""
    try:
        shapes = [
            shape._replace(heads=args.heads, head_dim=args.head_dim,
                           pool=args.pool, topk=args.topk).check()
            for shape in args.shapes
        ]
    except ValueError as error:
        raise UsageError(f'--shapes: {error}') from None
    cases = [Case(arch, args.dtype, shape)
             for arch in args.archs for shape in shapes]
    results = compile_isolated(cases, args.cache_dir,
                               keep_sass=bool(args.sass_dir),
                               workers=args.workers)
    if args.sass_dir:
        _write_sass(results, args.sass_dir)
    doc = document(args)
    doc.update(report(results))
    finish(doc, args, table)
    return 0

