"""Launch settings per target: the tiles, warps, stages and register caps
of every kernel as a function of the shapes, the dtype and the compute
capability triton compiles for (:class:`Config`), and whether the
kernels run in triton's interpreter.
"""
import functools
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from .helpers import _dot

try:  # the kernels are interpreted when TRITON_INTERPRET=1 was set
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:  # pragma: no cover - very old triton
    InterpretedFunction = ()


def _next_pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _log2(x: int) -> int:
    """log2 of a power of two."""
    return x.bit_length() - 1


# The fused top-k folds K_PAD (k rounded up to a power of two) keys at a
# time into a sorted list: (log2 K)(log2 K + 3) / 2 + 1 compare-exchange
# steps per key folded (28 at K = 64), on the chunk maxima and their
# candidates. Larger k: R K^T is stored and torch.topk selects.
TOPK_FUSED_MAX = 64


def _chunking(n: int, k_pad: int, tile: int) -> Tuple[int, int]:
    """log2 of the tokens per chunk (at most ``k_pad``) and of the chunks
    per group (a group at most ``tile`` tokens: the keys pass's key tile
    holds whole groups) of the fused top-k of ``n`` tokens, ``k_pad`` a
    fold: the
    fewest folds of ``k_pad`` keys (the groups' maxima, ``k_pad`` at a
    time; the chunks of the ``k_pad`` best groups, if groups have several;
    the tokens of the ``k_pad`` best chunks, a fold that recomputes their
    logits: counted twice; none for chunks of one token, whose maxima are
    the tokens' own keys), then one level rather than two, then the
    fewest chunks. k = 49 (``k_pad`` 64): chunks of 1 token in groups of 4
    at n = 1025, of 4 tokens in groups of 4 at 4097, of 8 in groups of 8 at
    65537."""
    best = None
    for log_c in range(_log2(min(k_pad, tile)) + 1):
        chunks = _cdiv(n, 1 << log_c)
        for log_g in range(_log2(tile) - log_c + 1):
            # A fold of tokens recomputes their logits too: about twice a
            # fold of maxima (sm_90's SASS, 1 warp); none for chunks of one
            # token (their maxima are the tokens' logits).
            folds = (_cdiv(_cdiv(chunks, 1 << log_g), k_pad) +
                     (1 << log_g if log_g else 0) +
                     (2 << log_c if log_c else 0))
            key = (folds, log_g > 0, -log_c)
            if best is None or key < best[0]:
                best = key, (log_c, log_g)
    return best[1]


# Pipeline stages of _keys, _experts_fwd, _experts_bwd and _shared_bwd in
# bf16 / fp16 per target: the most that fit its shared memory per block
# (sm_89: 99 KiB) and compile without register spills under triton 3.6 to
# 3.9 (_keys on sm_90: one, two spill under 3.9); an unknown target gets
# sm_89's.
_STAGES = {80: (2, 3, 3, 3), 89: (2, 2, 2, 2), 90: (1, 3, 2, 2)}
# Registers a thread can address (the ISA's limit).
MAX_REGISTERS = 255


class Config:
    """Tiles and launch settings of one call: a function of the shapes
    (tokens ``n``, landmarks ``m``, head_dim ``d``, routed keys ``k``,
    ``groups``), the dtype, the target ``arch`` (the compute capability
    the kernels are compiled for, e.g. 90; None: the interpreter's small
    tiles) and the device's ``sms`` (streaming multiprocessors: the keys
    pass aims at two waves of programs, the merge's warps at the programs
    an SM runs)."""

    def __init__(self, n: int, m: int, d: int, k: int, groups: int,
                 dtype: torch.dtype, arch: Optional[int], sms: int = 132):
        self.sms = sms
        self.n, self.m, self.k, self.groups = n, m, k, groups
        self.block_d = max(16, _next_pow2(d))
        self.m_pad = max(16, _next_pow2(m))
        self.k_pad = max(16, _next_pow2(k))
        self.fused_topk = self.k_pad <= TOPK_FUSED_MAX
        # float32: exact products (tf32 would lose 3 decimal digits).
        self.precision = 'ieee' if dtype == torch.float32 else 'tf32'
        self.upcast = interpreted() and dtype == torch.bfloat16
        self.options = {}
        # The experts' backward sums dR, dVt over a program's tiles in
        # registers (two [M_PAD, BLOCK_D] float32 tiles beside its own): on
        # sm_90 in 16 bits with head_dim <= 64 and tiles of at most 64
        # queries (experts of N / m <= 64), on 8 warps, where it compiles
        # without spills under triton 3.6 to 3.9 (sm_80 and sm_89 spill 16
        # to 324 bytes, head_dim 128 up to 1068, tiles of 128 on sm_90 68
        # under 3.7.1); elsewhere a tile adds its own.
        self.sum_landmarks = arch is None or (
            arch == 90 and self.block_d <= 64 and dtype != torch.float32 and
            _cdiv(n, m) <= 64)
        if arch is None:  # small blocks: the interpreter runs them in numpy
            self.block = self.block_m = self.block_m_bwd = 16
            self.block_n = self.block_n_bwd = self.keys_n = 16
            self.e_tile = self.block_p = 16
            self.shared_n = self.pool_n = 16
            # Queries per routing / sorting tile: more than a split holds.
            self.block_q = self.block_i = 64
        else:
            self._gpu_tiles(n, m, dtype, arch)
        self.block_l = 16  # landmarks per tile of the shared backward
        # The fused top-k's chunks of 2**log_c tokens, in groups of
        # 2**log_g (a key tile holds whole groups).
        self.log_c, self.log_g = _chunking(n, self.k_pad, self.keys_n)
        # Landmarks per tile of the keys pass (and of the merge's recompute
        # of its logits: the same product, 16 rows at a time). On sm_90 in
        # 16 bits with head_dim <= 64, chunks of several tokens: all of
        # them in one tile, up to 64, the keys streamed once instead of
        # once per 16 landmarks (N = 4097: 8.2 -> 5.6 us in the model,
        # 65537: 55.3 -> 39.2). Chunks of one token (N = 1025), whose
        # maxima are a [L, BLOCK_N] tile of their own: 16 (64 spill under
        # triton 3.6 and 3.9; 32 is slower than 16 under 3.6 and 3.7.1).
        # Elsewhere 16: 64 spilled on sm_80 (8 to 464 bytes) and sm_89 (56),
        # and 32 took every register on sm_80.
        wide = (arch == 90 and dtype != torch.float32 and
                self.block_d <= 64 and self.log_c > 0)
        self.keys_l = min(self.m_pad, 64) if wide else 16
        # Splits of the keys pass: two waves of programs over the groups (a
        # few programs in the interpreter, which runs them one by one), at
        # least two key tiles each.
        programs = 8 if arch is None else 2 * sms
        self.chunk = max(
            2 * self.keys_n,
            _cdiv(_cdiv(n, _cdiv(programs, groups)), self.keys_n) *
            self.keys_n)
        self.splits = _cdiv(n, self.chunk)
        # Splits per tile of the merge (2 in the interpreter: several tiles
        # and a last, partial one).
        self.block_s = min(2 if arch is None else 16, _next_pow2(self.splits))
        if arch is not None:  # small tiles: warps from the programs an SM
            self.options.update(
                pool=dict(num_warps=self._few_warps(groups * m),
                          num_stages=1),
                merge=dict(num_warps=self._merge_warps(groups),
                           num_stages=1, maxnreg=MAX_REGISTERS))
        self.num_blocks = n // self.block + min(m, n)
        self.slots = self.block * self.num_blocks
        # Programs of the experts' backward per group, each taking every
        # parts-th slot tile: two waves (3 in the interpreter: tiles left
        # over), as few as a program's dR, dVt adds allow.
        tiles = self.slots // self.block_m_bwd
        self.bwd_parts = min(tiles, 3 if arch is None else _cdiv(
            programs, groups))

    def _gpu_tiles(self, n: int, m: int, dtype: torch.dtype, arch: int):
        # Blocks no larger than the mean expert (N / m queries). float32
        # (exact IEEE products, no tensor cores: the accurate path, not
        # the fast one) uses 32: 64-wide IEEE dots take 3x the compile time.
        largest = 32 if dtype == torch.float32 else 64
        # The backward adds its expert's key and landmark gradients once a
        # block: with head_dim <= 64, blocks of up to 128 queries (8 warps),
        # half the float32 atomics of 64 where experts are that large; the
        # forward takes them 64 at a time.
        widest = 128 if largest == 64 and self.block_d <= 64 else largest
        self.block = min(widest, max(16, _next_pow2(_cdiv(n, m))))
        self.block_m = min(self.block, largest)
        # head_dim 128: the backward 32 queries a program (64 need every
        # register of a thread and spill under triton 3.8 and 3.9).
        self.block_m_bwd = self.block if self.block_d <= 64 else min(
            self.block, 32)
        if arch == 80:  # 128 queries, looped over, spill under triton 3.9
            self.block_m_bwd = min(self.block_m_bwd, 64)  # (on 8 warps)
        self.block_n = min(64 if self.block_d <= 64 else 32, largest)
        self.block_n_bwd = 32
        self.keys_n = self.block_n
        # _shared_bwd: 64 keys a program on sm_90 (half the programs adding
        # into dR); 32 elsewhere (64 spills on sm_89, on 4 or 8 warps).
        self.shared_n = 128 if arch == 90 and self.block_d <= 64 else 32
        self.pool_n = 32
        self.e_tile = min(self.m_pad, 64)
        self.block_q = 64
        self.block_p = 32  # patches a trip of the pooling: a bin holds N / m
        self.block_i = 32
        warps = 4 if self.block_d <= 64 else 8
        if dtype == torch.float32:
            # IEEE float32 dots run on CUDA cores, from registers: smaller
            # query tiles, the widest tiles on 8 warps, 2 stages.
            self.block_q, self.block_m_bwd, self.shared_n = 32, 16, 32
            warps = (8, warps, warps, 8)
            stages = (2, 2, 2, 2)
        else:
            # The keys pass on sm_89 (and any other target): 8 warps (4
            # spill its top-k fold). The experts forward's tiles of 32
            # queries on 2 warps, 16 rows a warp (4 issue 1.3x the
            # instructions in all: 15.2 -> 11.7 us at N = 1025 on sm_90; 64
            # queries on 2 spill). The experts backward on 8 where it sums
            # dR, dVt, above 64 queries, and on sm_80 at 64 (4 spill).
            fwd_warps = (2 if self.block_m <= 32 and self.block_d <= 64 else
                         warps)
            bwd_warps = (8 if self.sum_landmarks or self.block_m_bwd > 64 or
                         (arch == 80 and self.block_m_bwd == 64) else warps)
            warps = (warps if arch in (80, 90) else 8, fwd_warps, bwd_warps,
                     8 if self.shared_n > 64 else warps)
            stages = _STAGES.get(arch, _STAGES[89])
        self.options = dict(
            pool_bwd=dict(num_warps=4, num_stages=1),
            **{
                name: dict(num_warps=w, num_stages=s)
                for name, w, s in zip(('keys', 'experts_fwd', 'experts_bwd',
                                       'shared_bwd'), warps, stages)
            })
        # The experts forward's two loops (the compressed keys, the routed
        # keys) of one trip each (m, k <= BLOCK_N; 49 in 64 at every shape
        # of the model) have no later trip to prefetch: one stage, not a
        # pipeline prologue that issues the loads of trips that do not run
        # (in the model on sm_90: 12.1 -> 9.6 us at N = 1025, 8.2 -> 6.7 at
        # 4097, 42.6 -> 35.2 at 65537), with up to MAX_REGISTERS a thread:
        # ptxas held one stage at 168 and spilled 4 bytes under triton 3.6
        # (32 queries on 2 warps on sm_90 at N = 1025, 64 on 4 on sm_80 at
        # 4097); with the cap lifted it takes 190 and 183. In 16 bits, where
        # the compile test checks it (float32's tiles of 32 keys take two
        # trips at m = 49).
        if dtype != torch.float32 and max(m, self.k) <= self.block_n:
            self.options['experts_fwd'].update(num_stages=1,
                                               maxnreg=MAX_REGISTERS)
        # ptxas (a release per triton release) may hold a kernel below the
        # registers it needs, and spill: 128 a thread for a block of 8 warps
        # at head_dim 128 (ptxas 12.9, triton >= 3.8), and for _merge
        # (triton 3.6). Those take up to MAX_REGISTERS; the others keep
        # ptxas's choice (a cap there makes it trade occupancy for
        # registers, and spills _experts_bwd at head_dim 64 on sm_89).
        # (_merge's cap is set with its warps, once the splits are known.)
        # So does _experts_bwd where its program holds its dR, dVt sums, and
        # _experts_fwd in one stage (above).
        for options in self.options.values():
            if options['num_warps'] == 8 and self.block_d > 64:
                options['maxnreg'] = MAX_REGISTERS
        if self.sum_landmarks:
            self.options['experts_bwd']['maxnreg'] = MAX_REGISTERS
        if arch == 80:  # ptxas 12.9 (triton 3.9) held it at 168 and spilled
            self.options['keys']['maxnreg'] = MAX_REGISTERS

    def _merge_warps(self, groups: int) -> int:
        """The merge's warps: 1 with a fused top-k (its folds of ``K_PAD``
        keys, about 2 a lane on 1 warp, would be repeated by more warps or
        split between them through shared memory: 950 instructions a warp
        for a fold on 4, 390 on 1), else by its programs."""
        if self.fused_topk:
            return 1
        return self._few_warps(groups * max(self.m, self.splits))

    def _few_warps(self, programs: int) -> int:
        """Warps of a program of small tiles (a landmark's pooling; the
        merge's lists, counts and sort), which more warps only split
        further (steps between warps through shared memory) or repeat, so
        fewer warps issue less; but each scheduler of an SM needs two warps
        or more to hide latency: 1 warp where the grid has 8 programs an
        SM, 2 where it has 4, else 4."""
        per_sm = programs / self.sms
        return 1 if per_sm >= 8 else 2 if per_sm >= 4 else 4

    @property
    def chunks(self) -> int:
        """Chunks of the fused top-k per landmark."""
        return _cdiv(self.n, 1 << self.log_c)

    @property
    def chunk_groups(self) -> int:
        """Groups of chunks of the fused top-k per landmark."""
        return _cdiv(self.chunks, 1 << self.log_g)

    @property
    def log_rest(self) -> int:
        """The merge folds the groups' maxima K_PAD at a time; a last,
        partial tile the maxima it holds, rounded up to a power of two (-1:
        none)."""
        rest = self.chunk_groups % self.k_pad
        return _log2(_next_pow2(rest)) if rest else -1

    @property
    def sort_rows(self) -> int:
        """Rows of 32 queries a tile of the merge's sort ranks: a row a
        warp (2 in the interpreter: a tile ranks across rows)."""
        return self.options['merge']['num_warps'] if self.options else 2

    def grid(self, kernel: str) -> Tuple[int, int]:
        """The grid of ``kernel`` (a name of
        :data:`mmseg_mita.ops.triton_backend.KERNELS`)."""
        per_group = dict(
            pool=self.m,
            keys=self.splits,
            merge=max(self.m, self.splits),
            experts_fwd=self.slots // self.block_m,
            experts_bwd=self.bwd_parts,
            shared_bwd=_cdiv(self.n, self.shared_n),
            pool_bwd=_cdiv(self.n, self.pool_n))
        return self.groups, per_group[kernel]

    def launch(self, kernel: str) -> dict:
        """Launch options of ``kernel`` (none in the interpreter)."""
        return {} if interpreted() else self.options[kernel]


def interpreted() -> bool:
    """Whether the kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1
    was set before triton was first imported (triton's own ``tl.zeros``,
    ``tl.sum``... are decorated when triton is imported)."""
    return all(
        isinstance(fn, InterpretedFunction) for fn in (_dot, tl.zeros))


def _target() -> Tuple[Optional[int], int]:
    """The compute capability the kernels compile for and the streaming
    multiprocessors of the device they run on, from triton's active driver
    (what a real launch compiles for, and what an ahead-of-time check
    stubs); arch 0 for a non-CUDA target; (None, 0) in the interpreter."""
    if interpreted():
        return None, 0
    driver = triton.runtime.driver.active
    arch = driver.get_current_target().arch
    return (arch if isinstance(arch, int) else 0,
            _multiprocessors(driver.utils, driver.get_current_device()))


@functools.lru_cache(maxsize=16)
def _multiprocessors(utils, device: int) -> int:
    """The SMs of ``device`` that a driver's ``utils`` report (asked once:
    every call's settings need them)."""
    return utils.get_device_properties(device)['multiprocessor_count']


def call_config(q: Tensor, m: int, k: int) -> Config:
    """The :class:`Config` of a call on ``q`` [B, heads, N, d]."""
    b, heads, n, d = q.shape
    return Config(n, m, d, min(k, n), b * heads, q.dtype, *_target())
