"""MiTA (default variant) as one fused Triton pipeline (CUDA; CPU through
``TRITON_INTERPRET=1``), shared part included.

Per group ``g = (batch, head)``, ``s = d ** -0.5`` (spec:
:func:`~.naive.naive_mita`), the forward is FOUR launches:

1. ``_pool``, grid (G, m): landmark ``j`` is the mean of the patch queries
   of its bin (PyTorch's adaptive bins, which may overlap) -> ``R``;
2. ``_keys``, grid (G, S): the tokens in ``S`` splits of ``chunk`` (about
   two waves of programs over the groups, at least two key tiles each).
   Split ``s`` streams its keys once per tile of 16 landmarks: ``R K^T``
   feeds a partial online softmax of ``s R K^T`` (the split's output and
   log-sum-exp, as in flash-decoding) and, per landmark, the largest logit
   of each chunk of ``c`` tokens (a split starts and ends on chunk bounds),
   stored as int32 bits that order as the float32 logit (NaN above every
   number, as in ``torch.topk``). Then it routes its own queries,
   ``argmax_j q . R_j`` (the first index on ties; a NaN score counts as
   +inf, so an all-NaN row goes to expert 0, as ``torch.argmax`` sends it;
   an id outside ``[0, m)``, what a compiled argmax may return for a row it
   cannot order, becomes 0: every query gets its output rows), and counts
   them per expert;
3. ``_merge``, grid (G, max(m, S)): program ``p < m`` merges expert ``p``'s
   S partial softmaxes into its shared values ``Vt`` and their log-sum-exp
   (saved for the backward), selects its ``k`` keys from its chunk maxima
   (below) and marks its blocks; program ``p < S`` writes the queries of
   split ``p``
   to their slots, a stable counting sort: a query's slot is its expert's
   first slot (after the blocks of the experts before it, from the splits'
   counts), plus its expert's queries in earlier splits, plus its rank
   among them in the split (by bit masks over rows of 32 queries, a row
   a warp). Fixed-capacity layout: a group has
   ``NB = N // BLOCK + min(m, N)`` blocks of ``BLOCK`` slots (an expert
   with ``c`` queries takes ``ceil(c / BLOCK)`` consecutive blocks, in
   expert order; ``sum ceil(c_e / BLOCK) <= N / BLOCK + #non-empty``);
   ``slots`` maps slot -> query (-1 empty), ``block_expert`` block ->
   expert (-1 unused);
4. ``_experts_fwd``, one program per ``BLOCK_M`` slots (a part of one
   block; it returns at once if they hold no query): ONE online softmax
   (float32, base 2) over the ``m`` compressed logits ``s^2 q . R``
   (recomputed from ``R``: cheaper than storing [G, N, m]) with values
   ``Vt`` and the expert's ``k`` routed keys, read
   by index from K and V; writes the output and its log-sum-exp.

The top-k selects exactly the set ``torch.topk`` would, ties to the lower
token: each key is an int64, the order-preserving bits of its float32
logit above ``2^32 - 1 - token``. A chunk's key is its maximum's bits
above ``2^32 - 1 - chunk`` (ties to the lower chunk, whose tokens are all
lower); the ``K_PAD`` chunks of the largest keys (``k`` rounded up to a
power of two) hold the ``K_PAD`` largest token keys, as no key of another
chunk beats the maximum of each of them. The merge folds a landmark's
chunk keys ``K_PAD`` at a time into a sorted list (a bitonic sort of the
tile, the elementwise max with the list, one bitonic merge); at large N
first the maxima of groups of ``g`` chunks, then the chunks of the best
``K_PAD`` groups (the same argument one level up); then it recomputes the
logits of the best chunks' ``K_PAD c`` tokens with the keys pass's own
product (bit for bit: a landmark in every row of the same ``tl.dot``) and
folds their keys. No trip count depends on the data.

For ``k > 64`` (:data:`TOPK_FUSED_MAX`) ``_keys`` stores ``R K^T``
(float32 [G, m, N]) instead of the chunk maxima and
``torch.topk(min(topk, N), sorted=False)`` selects: 5 launches.

Backward (flash-style: probabilities recomputed from the saved
log-sum-exp), THREE launches after ONE zero-filled float32 buffer:

1. ``_experts_bwd``, grid (G, P): program ``p`` takes the group's tiles
   of ``BLOCK_M`` slots ``p, p + P, ..`` (strided: the unused blocks, at
   the layout's end, are shared out; ``P`` makes about two waves of
   programs). Per tile holding queries: ``delta = rowsum(dO * O)``;
   compressed keys: ``dq += s^2 dS R``, ``dR += s^2 dS^T q``, ``dVt += P^T
   dO``; routed keys: ``dq += s dS K``, ``dk += s dS^T q``, ``dv += P^T
   dO`` (atomics: a key may be routed by several experts, an expert span
   several blocks). ``dq`` (float32) is stored. ``dR``, ``dVt``
   (float32): with ``SUM_LANDMARKS`` (sm_90, 16 bits, head_dim <= 64,
   experts of at most 64 queries: where registers hold it) every landmark
   in one tile, summed in registers over the program's tiles (every query
   attends to every landmark, so the sums run across experts) and added
   once at its end (``P`` atomic adds a landmark and group: 6 instead of
   49 at N = 1025); else added atomically a tile;
2. ``_shared_bwd``, one program per (group, key block): the shared
   expert's backward from its saved log-sum-exp,
   ``dS = P (dVt V^T - rowsum(dVt * Vt))``, ``dR += s dS K`` (atomics),
   ``dk += s dS^T R``, ``dv += P^T dVt``; it owns its keys, so it adds the
   routed sums of step 1 and writes ``dk``, ``dv`` in their dtype;
3. ``_pool_bwd``, one program per (group, token block): ``dq += dR / bin
   size`` of each bin holding the patch query, gathered (a patch lies in at
   most 2 x 2 bins, as the pool size is at most the grid), written in its
   dtype.

Every atomic is a relaxed float32 add whose sum a later launch reads (the
kernel boundary orders it): no kernel has a memory fence, and no program
waits for another. Tiles and launch settings (:class:`_Config`) are a
function of the shapes, the dtype and the target that triton's active
driver compiles for (``get_current_target().arch``, which an
ahead-of-time check can stub): per target, every launch fits the shared
memory of a block and compiles without register spills in bf16 / fp16
(docs/gpu.md lists them).

Launches per call (ATen ops that do work + Triton kernels; measured in the
interpreter at N = 1025 and 4097, bf16, 6 heads, k = 49): 4 forward, 8
forward + backward (the 4 above, the fill, 3 kernels); for k > 64 plus
``torch.topk``; under autocast, plus the casts of q, k, v to the autocast
dtype.
No host synchronisation and no host-to-device copy: every buffer is sized
from the shapes, no count is read on the host. The forward and the backward
are ``torch.library`` custom ops (``mmseg_mita::mita_triton_fwd`` /
``mmseg_mita::mita_triton_bwd``, with fake implementations and autograd),
so ``torch.compile(fullgraph=True)`` captures a call without a graph break
(and, with no host sync and shape-only sizes, a CUDA graph can replay it).

Entry points: :func:`mita_triton` (the default variant, either landmark
convention), the run of ``mita_attention(backend='triton')``;
:func:`mita_triton_routed` (the same with the routing given, for the
low-precision tests). Both take the call's :class:`~.plan.MiTAPlan`.

Contract: q, k, v [B, heads, N, d] (any strides with a contiguous last
dim: strided views are read in place), float32 / float16 / bfloat16 (under
autocast: the autocast dtype), d <= 128; softmax and accumulation in
float32, float32 products in IEEE precision (never tf32). The gradients
are summed with float32 atomics: not bitwise deterministic on CUDA (as
``index_add_`` is not). What it does not compute (dropout, float64,
``head_dim > 128``, several experts per query, the ablations, CPU tensors
without the interpreter) is declared in ``BACKEND``, at the end: the
dispatcher refuses those calls, naming each reason, before they reach the
entry points. The registry (:mod:`.backends`) imports this module when
``backend='triton'`` is first asked for.
"""
import functools
from typing import List, Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from .declaration import HALF_DTYPES, MiTABackend
from .experts import compute_dtype
from .plan import MiTAPlan

try:  # the kernels below are interpreted when TRITON_INTERPRET=1 was set
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:  # pragma: no cover - very old triton
    InterpretedFunction = ()

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * LOG2E)
# Below every key of _ranked: the empty places of a top-k list.
LOWEST = tl.constexpr(-2**63)
# Below the bits of every float32 (_order_bits): a token past the end.
LOWEST_BITS = tl.constexpr(-2**31)


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """``a @ b`` accumulated in float32. ``UPCAST``: operands go to float32
    first (Triton's interpreter multiplies bfloat16 bit patterns as integers;
    bf16 products are exact in float32, as on the tensor cores)."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _cast(x, dtype: tl.constexpr, UPCAST: tl.constexpr):
    """``x.to(dtype)``, rounded to nearest even. ``UPCAST`` (bfloat16 in
    Triton's interpreter, whose float32 -> bfloat16 cast truncates): rounded
    by hand first, as the GPU does."""
    if UPCAST:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _head_dim(d, BLOCK_D: tl.constexpr):
    """Offsets along the head dimension and their mask."""
    offs_d = tl.arange(0, BLOCK_D)
    return offs_d, offs_d < d


@triton.jit
def _group_base(g, heads, stride_b, stride_h):
    """Offset of group ``g = batch * heads + head`` in a [B, heads, N, d]
    tensor of those strides."""
    return (g // heads).to(tl.int64) * stride_b + (g % heads) * stride_h


@triton.jit
def _row_offsets(rows, row_mask, stride_n, offs_d, d_mask):
    """Offsets and 2-D mask of rows ``rows`` (int64) of a [N, d] matrix
    (row stride ``stride_n``, contiguous last dim)."""
    return (rows[:, None] * stride_n + offs_d[None, :],
            row_mask[:, None] & d_mask[None, :])


@triton.jit
def _load_rows(ptr, rows, row_mask, stride_n, offs_d, d_mask):
    """Rows ``rows`` (int64) of a [N, d] matrix (row stride ``stride_n``,
    contiguous last dim), zero where masked."""
    offs, mask = _row_offsets(rows, row_mask, stride_n, offs_d, d_mask)
    return tl.load(ptr + offs, mask=mask, other=0.0)


@triton.jit
def _bin_bounds(offs_l, hgt, wid, ph, pw):
    """PyTorch's adaptive-pooling bin of landmark ``offs_l`` (row-major on
    ``ph x pw``; bin i of an axis of length L is ``[floor(i L / p),
    ceil((i + 1) L / p))``, bins may overlap): first and end row, first and
    end column on the ``hgt x wid`` grid."""
    bi = offs_l // pw
    bj = offs_l % pw
    return (bi * hgt // ph, ((bi + 1) * hgt + ph - 1) // ph, bj * wid // pw,
            ((bj + 1) * wid + pw - 1) // pw)


@triton.jit
def _axis_bins(x, length, p):
    """The (at most two, as ``p <= length``) adaptive bins of an axis of
    ``length`` in ``p`` bins that hold coordinate ``x`` (>= 0): bin i holds x
    iff ``floor(i L / p) <= x < ceil((i + 1) L / p)``, i.e. ``floor(x p / L)
    <= i <= floor(((x + 1) p - 1) / L)``. Returns the first (int32), whether
    the next holds ``x`` too, and the lengths of both (int32); unsigned
    divisions, cheaper than signed ones."""
    x = x.to(tl.uint32)
    length = length.to(tl.uint32)
    p = p.to(tl.uint32)
    first = x * p // length
    two = first < ((x + 1) * p - 1) // length
    start = first * length // p
    next_start = (first + 1) * length // p
    end = ((first + 1) * length + p - 1) // p
    next_end = ((first + 2) * length + p - 1) // p
    return (first.to(tl.int32), two, (end - start).to(tl.int32),
            (next_end - next_start).to(tl.int32))


@triton.jit
def _online_softmax(m_i, l_i, acc, logits, values, PRECISION: tl.constexpr,
                    UPCAST: tl.constexpr):
    """Fold one block of base-2 logits (-inf where masked) and their values
    into the running max ``m_i``, sum ``l_i`` and output ``acc``."""
    m_new = tl.maximum(m_i, tl.max(logits, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(logits - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(
        _cast(p, values.dtype, UPCAST), values, PRECISION, UPCAST)
    return m_new, l_i, acc


@triton.jit
def _order_bits(x):
    """int32 bits ordered as the float32 ``x`` (NaN above +inf, as in
    ``torch.topk``; -0.0 as 0.0): the bits of ``x``, those of a negative
    reversed."""
    bits = tl.where(x == 0, 0.0, x).to(tl.int32, bitcast=True)
    bits = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negatives: reversed
    return tl.where(x != x, 0x7FFFFFFF, bits)


@triton.jit
def _keyed(bits, index, mask):
    """int64 keys: ``bits`` (int32, of :func:`_order_bits`) above ``2**32 -
    1 - index`` (``index`` >= 0), so that ties go to the lower ``index``;
    :data:`LOWEST` where ``mask`` is off."""
    keys = (bits.to(tl.int64) << 32) | (4294967295 - index.to(tl.int64))
    return tl.where(mask, keys, LOWEST)


@triton.jit
def _ranked(x, index, mask):
    """int64 keys ordered as the float32 ``x`` (:func:`_order_bits`), ties to
    the lower ``index`` (token); :data:`LOWEST` where ``mask`` is off."""
    return _keyed(_order_bits(x), index, mask)


@triton.jit
def _token_of(keys):
    """The token index of keys of :func:`_ranked` (int64)."""
    return 4294967295 - (keys & 4294967295)


@triton.jit
def _bit(DIMS: tl.constexpr, BIT: tl.constexpr):
    """Bit ``BIT`` of the position of each element of a hypercube (``DIMS``
    axes of 2, the last axis bit 0), broadcastable to it."""
    return tl.reshape(
        tl.arange(0, 2), [1] * (DIMS - 1 - BIT) + [2] + [1] * BIT)


@triton.jit
def _bitonic(cube, DIMS: tl.constexpr, RUN: tl.constexpr,
             ORDER: tl.constexpr):
    """Each bitonic run of ``2**RUN`` elements of ``cube`` (position bits
    below ``RUN``; ``DIMS`` axes of 2) sorted: ascending (``ORDER`` 0),
    descending (1), or ascending where bit ``RUN`` of the position is 0 and
    descending where it is 1 (2). A step pairs the positions that differ in
    one bit, from the highest: the smaller of a pair goes first where the
    run ascends. An element's partner is the pair's sum minus it (a sum
    over an axis of 2; int64 wraps around exactly)."""
    if ORDER == 2:
        down = _bit(DIMS, RUN)
    else:
        down = ORDER
    for i in tl.static_range(RUN):  # bit RUN - 1 - i: axis DIMS - RUN + i
        partner = tl.sum(cube, DIMS - RUN + i, keep_dims=True) - cube
        first = (_bit(DIMS, RUN - 1 - i) ^ down) == 0
        # The first of a pair keeps the smaller: it takes its partner when
        # it is the larger (and the second when it is the smaller).
        cube = tl.where((cube > partner) == first, partner, cube)
    return cube


@triton.jit
def _largest(x, LOG_R: tl.constexpr, LOG_N: tl.constexpr,
             LOG_K: tl.constexpr, SORTED: tl.constexpr,
             LAST: tl.constexpr = 1):
    """The ``2**LOG_K`` largest of each row of ``x`` [2**LOG_R rows,
    2**LOG_N], descending (``LAST`` 1; ascending: 0): runs of ``2**LOG_K``
    sorted in alternating order (``SORTED``: given so, a single run
    descending), then the elementwise max of neighbouring runs (an
    ascending and a descending one: it holds the largest of both as a
    bitonic run) sorted again, until one run is left."""
    DIMS: tl.constexpr = LOG_R + LOG_N
    cube = tl.reshape(x, [2] * DIMS)
    if not SORTED:
        for run in tl.static_range(1, LOG_K + 1):
            cube = _bitonic(cube, DIMS, run, 2 if run < LOG_N else LAST)
    for i in tl.static_range(LOG_N - LOG_K):
        cube = tl.max(cube, DIMS - 1 - i - LOG_K)  # neighbouring runs
        cube = _bitonic(cube, DIMS - 1 - i, LOG_K,
                        2 if i + 1 < LOG_N - LOG_K else LAST)
    return tl.reshape(cube, x.shape[:-1] + [2**LOG_K])


@triton.jit
def _fold_topk(best, keys, LOG_R: tl.constexpr, LOG_N: tl.constexpr,
               LOG_K: tl.constexpr, SORTED: tl.constexpr):
    """The ``2**LOG_K`` largest of ``best`` (ascending along its last axis)
    and ``keys`` (``2**LOG_N`` along the last axis, any order; ``SORTED``:
    runs of ``2**LOG_K`` sorted in alternating order, as :func:`_largest`
    takes them; both with ``2**LOG_R`` rows), ascending: the elementwise
    max of an ascending and a descending list holds the largest of both as
    a bitonic run, which one bitonic merge sorts."""
    DIMS: tl.constexpr = LOG_R + LOG_K
    cube = tl.reshape(
        tl.maximum(best, _largest(keys, LOG_R, LOG_N, LOG_K, SORTED)),
        [2] * DIMS)
    return tl.reshape(_bitonic(cube, DIMS, LOG_K, 0), best.shape)


@triton.jit
def _probs(a, b, lse, pair_mask, scale, PRECISION: tl.constexpr,
           UPCAST: tl.constexpr):
    """Probabilities of the logits ``scale * a b^T`` (``scale`` in base 2),
    recomputed from the log-sum-exp of each row (0 where masked)."""
    logits = _dot(a, tl.trans(b), PRECISION, UPCAST)
    return tl.where(pair_mask, tl.exp2(logits * scale - lse[:, None]), 0.0)


@triton.jit
def _landmark_rows(g, offs, m, d, offs_d, d_mask):
    """Offsets and mask of rows ``offs`` of group ``g`` in a contiguous
    [G, m, d] tensor (landmarks, shared values and their gradients)."""
    mask = offs < m
    return ((g * m + offs).to(tl.int64)[:, None] * d + offs_d[None, :],
            mask[:, None] & d_mask[None, :], mask)


@triton.jit
def _compressed_keys(R, VT, g, n0, m, d, offs_d, d_mask,
                     BLOCK_N: tl.constexpr):
    """The compressed keys ``n0 ..`` of group ``g``: their landmarks (the
    logits are ``s^2 q . R``), shared values ``Vt``, mask, and the offsets
    and mask of their rows in R / Vt."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    r_offs, r_mask, n_mask = _landmark_rows(g, offs_n, m, d, offs_d, d_mask)
    marks = tl.load(R + r_offs, mask=r_mask, other=0.0)
    values = tl.load(VT + r_offs, mask=r_mask, other=0.0)
    return marks, values, n_mask, r_offs, r_mask


@triton.jit
def _score_grad(p, do, values, delta, PRECISION: tl.constexpr,
                UPCAST: tl.constexpr):
    """Softmax backward: ``dS = P * (dO V^T - delta)``."""
    dp = _dot(do, tl.trans(values), PRECISION, UPCAST)
    return p * (dp - delta[:, None])


@triton.jit
def _block(Q, SLOTS, BLOCK_EXPERT, g, tile, heads, sqb, sqh, sqn, d,
           slots_per_group, num_blocks, BLOCK: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """The ``BLOCK_M`` slots ``tile`` of group ``g`` (``BLOCK_M`` divides
    the layout's ``BLOCK``): their expert (-1 when the slots hold no query:
    an unused block, or the empty end of an expert's last block, as its
    queries fill its slots first), their queries' rows (int64, 0 where
    empty) and mask, the head-dim offsets and mask, and the queries."""
    expert = tl.load(BLOCK_EXPERT + g * num_blocks + tile * BLOCK_M // BLOCK)
    first = SLOTS + g.to(tl.int64) * slots_per_group + tile * BLOCK_M
    expert = tl.where(tl.load(first) < 0, -1, expert)
    rows = tl.load(first + tl.arange(0, BLOCK_M))
    row_mask = rows >= 0
    rows = tl.where(row_mask, rows, 0).to(tl.int64)
    offs_d, d_mask = _head_dim(d, BLOCK_D)
    q = _load_rows(Q + _group_base(g, heads, sqb, sqh), rows, row_mask, sqn,
                   offs_d, d_mask)
    return expert, rows, row_mask, offs_d, d_mask, q


@triton.jit
def _kv_bases(K, V, g, heads, skb, skh, svb, svh):
    """The bases of group ``g`` in K and V (their strides given)."""
    return (K + _group_base(g, heads, skb, skh),
            V + _group_base(g, heads, svb, svh))


@triton.jit
def _routed_keys(TOPK_E, k_base, v_base, n0, k, skn, svn, offs_d, d_mask,
                 BLOCK_N: tl.constexpr):
    """Keys ``n0 .. n0 + BLOCK_N`` of the expert whose top-k row starts at
    ``TOPK_E``, read by index from K and V (group bases ``k_base``,
    ``v_base``): their mask, token rows (int64), keys and values."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_mask = offs_n < k
    key_rows = tl.load(TOPK_E + offs_n, mask=n_mask, other=0)
    keys = _load_rows(k_base, key_rows, n_mask, skn, offs_d, d_mask)
    values = _load_rows(v_base, key_rows, n_mask, svn, offs_d, d_mask)
    return n_mask, key_rows, keys, values


@triton.jit
def _add(ptr, value, mask):
    """``ptr += value`` (float32 atomics, relaxed: every sum is read by a
    later launch, and a kernel boundary orders it)."""
    tl.atomic_add(ptr, value, mask=mask, sem='relaxed')


@triton.jit
def _add_key_grads(DK, DV, offs, mask, ds, p, q, do, PRECISION: tl.constexpr,
                   UPCAST: tl.constexpr):
    """Add ``dS^T q`` into ``DK`` and ``P^T dO`` into ``DV`` at ``offs``."""
    _add(DK + offs,
         _dot(_cast(tl.trans(ds), q.dtype, UPCAST), q, PRECISION, UPCAST),
         mask)
    _add(DV + offs,
         _dot(_cast(tl.trans(p), do.dtype, UPCAST), do, PRECISION, UPCAST),
         mask)


@triton.jit
def _route(q, R, g, m, d, offs_d, d_mask, E_TILE: tl.constexpr,
           PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """The expert of each query of ``q``: ``argmax_j q . R_j``, the first
    index on ties, a NaN score taken as +inf (an all-NaN row: expert 0, as
    ``torch.argmax``), over tiles of ``E_TILE`` landmarks."""
    top = tl.full([q.shape[0]], -float('inf'), tl.float32)
    expert = tl.zeros([q.shape[0]], tl.int32)
    for l0 in range(0, m, E_TILE):
        offs_l = l0 + tl.arange(0, E_TILE)
        r_offs, r_mask, l_mask = _landmark_rows(g, offs_l, m, d, offs_d,
                                                d_mask)
        scores = _dot(q, tl.trans(tl.load(R + r_offs, mask=r_mask, other=0.0)),
                      PRECISION, UPCAST)
        scores = tl.where(scores != scores, float('inf'), scores)
        scores = tl.where(l_mask[None, :], scores, -float('inf'))
        tile_top, tile_expert = tl.max(scores, 1, return_indices=True)
        wins = tile_top > top  # an earlier tile keeps a tie
        expert = tl.where(wins, l0 + tile_expert, expert)
        top = tl.where(wins, tile_top, top)
    return expert


@triton.jit(do_not_specialize=['hgt', 'wid', 'first'])
def _pool(Q, R, m, d, heads, first, hgt, wid, ph, pw, sqb, sqh, sqn,
          BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
          UPCAST: tl.constexpr):
    """Landmark ``j`` of group ``g`` (grid: G, m): the mean of the patch
    queries of its bin, ``BLOCK_P`` patches at a time."""
    g = tl.program_id(0)
    j = tl.program_id(1)
    r0, r1, c0, c1 = _bin_bounds(j, hgt, wid, ph, pw)
    bin_wid = c1 - c0
    size = (r1 - r0) * bin_wid
    offs_d, d_mask = _head_dim(d, BLOCK_D)
    q_base = Q + _group_base(g, heads, sqb, sqh)
    total = tl.zeros([BLOCK_P, BLOCK_D], tl.float32)
    for i0 in range(0, size, BLOCK_P):
        offs_i = i0 + tl.arange(0, BLOCK_P)
        # The patch's row in the bin (unsigned: cheaper), then its column.
        bin_row = (offs_i.to(tl.uint32) // bin_wid.to(tl.uint32)).to(tl.int32)
        rows = first + (r0 + bin_row) * wid + c0 + offs_i - bin_row * bin_wid
        total += _load_rows(q_base, rows.to(tl.int64), offs_i < size, sqn,
                            offs_d, d_mask).to(tl.float32)
    mark = tl.sum(total, 0) * (1.0 / size)
    tl.store(
        R + (g * m + j).to(tl.int64) * d + offs_d,
        _cast(mark, R.dtype.element_ty, UPCAST),
        mask=d_mask)


@triton.jit
def _first_rows(x, LOG_R: tl.constexpr, LOG_F: tl.constexpr):
    """The first ``2**LOG_F`` rows of ``x`` [2**LOG_R, C] (float32), exact:
    the others are summed in as zeros."""
    if LOG_F == LOG_R:
        return x
    cube = tl.reshape(x, [2**(LOG_R - LOG_F), 2**LOG_F, x.shape[1]])
    first = tl.arange(0, 2**(LOG_R - LOG_F))[:, None, None] == 0
    return tl.sum(tl.where(first, cube, 0.0), 0)


@triton.jit
def _logits(marks, keys, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """``R K^T`` of landmarks ``marks`` [16, BLOCK_D] and ``keys`` [*,
    BLOCK_D]: the one product of the keys pass and of the merge, which
    recomputes the logits of its candidates bit for bit."""
    return _dot(marks, tl.trans(keys), PRECISION, UPCAST)


@triton.jit
def _key_tile(logit_rows, chunk_rows, group_rows, n0, end, l_mask, marks,
              m_i, l_i, acc, k_base, v_base, skn, svn, offs_d, d_mask,
              qk_scale, FUSED_TOPK: tl.constexpr, STORE_LOGITS: tl.constexpr,
              LOG_N: tl.constexpr, LOG_C: tl.constexpr, LOG_G: tl.constexpr,
              PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Keys ``n0 .. n0 + 2**LOG_N`` (before ``end``) against the landmarks
    ``marks``: folded into their partial softmax (``m_i``, ``l_i``,
    ``acc``); ``FUSED_TOPK``: the largest logit of each chunk of ``2**LOG_C``
    keys stored as order-preserving bits at ``chunk_rows`` (``LOG_G`` > 0:
    and of each group of ``2**LOG_G`` chunks at ``group_rows``);
    ``STORE_LOGITS``: ``R K^T`` stored at ``logit_rows``. Returns the
    softmax state."""
    BLOCK_N: tl.constexpr = 2**LOG_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_mask = offs_n < end
    keys = _load_rows(k_base, offs_n.to(tl.int64), n_mask, skn, offs_d,
                      d_mask)
    values = _load_rows(v_base, offs_n.to(tl.int64), n_mask, svn, offs_d,
                        d_mask)
    logits = _logits(marks, keys, PRECISION, UPCAST)
    if STORE_LOGITS:
        tl.store(logit_rows + offs_n[None, :], logits,
                 mask=l_mask[:, None] & n_mask[None, :])
    if FUSED_TOPK:
        # A chunk's maximum; a split starts and ends on chunk bounds.
        bits = tl.where(n_mask[None, :], _order_bits(logits), LOWEST_BITS)
        top = tl.max(
            tl.reshape(bits, [marks.shape[0], BLOCK_N >> LOG_C, 2**LOG_C]), 2)
        offs_c = (n0 >> LOG_C) + tl.arange(0, BLOCK_N >> LOG_C)
        tl.store(chunk_rows + offs_c[None, :], top,
                 mask=l_mask[:, None] & ((offs_c << LOG_C) < end)[None, :])
        if LOG_G > 0:  # a group's maximum; a tile holds whole groups
            SPAN: tl.constexpr = LOG_C + LOG_G
            top = tl.max(
                tl.reshape(top, [marks.shape[0], BLOCK_N >> SPAN, 2**LOG_G]),
                2)
            offs_c = (n0 >> SPAN) + tl.arange(0, BLOCK_N >> SPAN)
            tl.store(group_rows + offs_c[None, :], top,
                     mask=l_mask[:, None] & ((offs_c << SPAN) < end)[None, :])
    scaled = tl.where(n_mask[None, :], logits * qk_scale, -float('inf'))
    return _online_softmax(m_i, l_i, acc, scaled, values, PRECISION, UPCAST)


@triton.jit
def _landmark_tile(R, PART_O, PART_LSE, CHUNK_MAX, GROUP_MAX, KEY_LOGITS, g,
                   l0, n, m, d, start, end, split, splits, k_base, v_base,
                   skn, svn, offs_d, d_mask, qk_scale,
                   FUSED_TOPK: tl.constexpr, STORE_LOGITS: tl.constexpr,
                   LOG_L: tl.constexpr, LOG_N: tl.constexpr,
                   LOG_C: tl.constexpr, LOG_G: tl.constexpr,
                   BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                   UPCAST: tl.constexpr):
    """Landmarks ``l0 ..`` (a tile of ``2**LOG_L``) over the keys ``start ..
    end`` of a split: their partial softmax and their chunk (and group)
    maxima."""
    BLOCK_L: tl.constexpr = 2**LOG_L
    BLOCK_N: tl.constexpr = 2**LOG_N
    offs_l = l0 + tl.arange(0, BLOCK_L)
    r_offs, r_mask, l_mask = _landmark_rows(g, offs_l, m, d, offs_d, d_mask)
    marks = tl.load(R + r_offs, mask=r_mask, other=0.0)
    m_i = tl.full([BLOCK_L], -float('inf'), tl.float32)
    l_i = tl.zeros([BLOCK_L], tl.float32)
    acc = tl.zeros([BLOCK_L, BLOCK_D], tl.float32)
    rows = (g * m + offs_l).to(tl.int64)[:, None]
    logit_rows = KEY_LOGITS + rows * n
    chunks = (n + 2**LOG_C - 1) >> LOG_C
    chunk_rows = CHUNK_MAX + rows * chunks
    group_rows = GROUP_MAX + rows * ((chunks + 2**LOG_G - 1) >> LOG_G)
    for n0 in range(start, end, BLOCK_N):
        m_i, l_i, acc = _key_tile(
            logit_rows, chunk_rows, group_rows, n0, end, l_mask, marks, m_i,
            l_i, acc, k_base, v_base, skn, svn, offs_d, d_mask, qk_scale,
            FUSED_TOPK, STORE_LOGITS, LOG_N, LOG_C, LOG_G, PRECISION, UPCAST)
    part = (g * m + offs_l).to(tl.int64) * splits + split  # [G, m, S]
    tl.store(
        PART_O + part[:, None] * d + offs_d[None, :],
        acc * (1.0 / l_i)[:, None],
        mask=r_mask)
    tl.store(PART_LSE + part, m_i + tl.log2(l_i), mask=l_mask)


@triton.jit(do_not_specialize=['n', 'chunk'])
def _keys(Q, K, V, R, GIVEN, EXPERT, COUNTS, PART_O, PART_LSE, CHUNK_MAX,
          GROUP_MAX, KEY_LOGITS, n, m, d, heads, chunk, sqb, sqh, sqn, skb,
          skh, skn, svb, svh, svn, qk_scale, ROUTE: tl.constexpr,
          FUSED_TOPK: tl.constexpr, STORE_LOGITS: tl.constexpr,
          LOG_L: tl.constexpr, LOG_N: tl.constexpr, LOG_C: tl.constexpr,
          LOG_G: tl.constexpr, BLOCK_Q: tl.constexpr, E_TILE: tl.constexpr,
          M_PAD: tl.constexpr, BLOCK_D: tl.constexpr,
          PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Split ``s`` (tokens ``[s chunk, (s + 1) chunk)``) of group ``g``
    (grid: G, S): per landmark, the partial softmax of ``s R K^T`` over its
    keys (output and log-sum-exp) and the largest logit of each of its
    chunks of ``2**LOG_C`` tokens and groups of ``2**LOG_G`` chunks
    (``FUSED_TOPK``; ``STORE_LOGITS``: ``R K^T`` stored instead); then the
    expert of each of its queries (``ROUTE``; else the ids in ``GIVEN``)
    and their count per expert.
    Landmarks in tiles of ``2**LOG_L``."""
    BLOCK_L: tl.constexpr = 2**LOG_L  # landmarks per tile
    g = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    start = split * chunk
    end = tl.minimum(start + chunk, n)
    offs_d, d_mask = _head_dim(d, BLOCK_D)
    k_base, v_base = _kv_bases(K, V, g, heads, skb, skh, svb, svh)
    for l0 in range(0, m, BLOCK_L):
        _landmark_tile(R, PART_O, PART_LSE, CHUNK_MAX, GROUP_MAX, KEY_LOGITS,
                       g, l0, n, m, d, start, end, split, splits, k_base,
                       v_base, skn, svn, offs_d, d_mask, qk_scale, FUSED_TOPK,
                       STORE_LOGITS, LOG_L, LOG_N, LOG_C, LOG_G, BLOCK_D,
                       PRECISION, UPCAST)
    q_base = Q + _group_base(g, heads, sqb, sqh)
    counts = tl.zeros([M_PAD], tl.int32)
    for i0 in range(start, end, BLOCK_Q):
        offs_i = i0 + tl.arange(0, BLOCK_Q)
        i_mask = offs_i < end
        if ROUTE:
            q = _load_rows(q_base, offs_i.to(tl.int64), i_mask, sqn, offs_d,
                           d_mask)
            expert = _route(q, R, g, m, d, offs_d, d_mask, E_TILE, PRECISION,
                            UPCAST)
        else:
            expert = tl.load(GIVEN + g * n + offs_i, mask=i_mask, other=0)
        # An index outside [0, m) (what a compiled argmax may give a row it
        # cannot order) goes to expert 0: every query gets an output row.
        expert = tl.where((expert >= 0) & (expert < m), expert, 0)
        expert = expert.to(tl.int32)
        tl.store(EXPERT + g * n + offs_i, expert, mask=i_mask)
        counts += tl.histogram(expert, M_PAD, mask=i_mask)
    tl.store(COUNTS + (g * splits + split) * M_PAD + tl.arange(0, M_PAD),
             counts)


@triton.jit
def _shared_expert(PART_O, PART_LSE, VT, LSE_R, row, part, splits, d,
                   BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
                   UPCAST: tl.constexpr):
    """Shared values and log-sum-exp of landmark ``row`` (of [G, m]) from
    the partial softmaxes of the splits (rows ``part ..`` of [G, m, S]),
    each weighted by its share of the total sum."""
    offs_d, d_mask = _head_dim(d, BLOCK_D)
    offs_s = tl.arange(0, BLOCK_S)
    top = tl.full([BLOCK_S], -float('inf'), tl.float32)
    for s0 in range(0, splits, BLOCK_S):
        top = tl.maximum(
            top,
            tl.load(PART_LSE + part + s0 + offs_s,
                    mask=s0 + offs_s < splits, other=-float('inf')))
    top = tl.max(top, 0)
    total = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([BLOCK_S, BLOCK_D], tl.float32)
    for s0 in range(0, splits, BLOCK_S):
        s_mask = s0 + offs_s < splits
        weight = tl.exp2(
            tl.load(PART_LSE + part + s0 + offs_s, mask=s_mask, other=0.0) -
            top)
        weight = tl.where(s_mask, weight, 0.0)
        total += weight
        acc += weight[:, None] * tl.load(
            PART_O + (part + s0 + offs_s)[:, None] * d + offs_d[None, :],
            mask=s_mask[:, None] & d_mask[None, :],
            other=0.0)
    total = tl.sum(total, 0)
    tl.store(
        VT + row.to(tl.int64) * d + offs_d,
        _cast(tl.sum(acc, 0) / total, VT.dtype.element_ty, UPCAST),
        mask=d_mask)
    tl.store(LSE_R + row, top + tl.log2(total))


@triton.jit
def _fold_chunks(best, maxima, index, valid, LOG_K: tl.constexpr):
    """``best`` (ascending) folded with the maxima ``maxima[index]`` (where
    ``valid``; ``2**LOG_K`` of them), keyed by index: ties to the lower
    chunk (or group)."""
    bits = tl.load(maxima + index, mask=valid, other=LOWEST_BITS)
    return _fold_topk(best, _keyed(bits, index, valid), 0, LOG_K, LOG_K,
                      False)


@triton.jit
def _fold_few(best, maxima, first, count, LOG_R: tl.constexpr,
              LOG_K: tl.constexpr):
    """``best`` (ascending, ``2**LOG_K``) folded with the ``2**LOG_R``
    maxima ``first ..`` (before ``count``; ``LOG_R <= LOG_K``): sorted
    descending, maxed into the first (smallest) places of ``best`` (an
    ascending and a descending list, the rest of the descending one below
    every key), one bitonic merge."""
    R: tl.constexpr = 2**LOG_R
    index = first + tl.arange(0, R)
    valid = index < count
    run = _keyed(tl.load(maxima + index, mask=valid, other=LOWEST_BITS),
                 index, valid)
    if LOG_R > 0:
        run = _largest(run, 0, LOG_R, LOG_R, False)
    rows = tl.reshape(best, [2**(LOG_K - LOG_R), R])
    rows = tl.where(
        tl.arange(0, 2**(LOG_K - LOG_R))[:, None] == 0,
        tl.maximum(rows, run[None, :]), rows)
    return tl.reshape(
        _bitonic(tl.reshape(rows, [2] * LOG_K), LOG_K, LOG_K, 0),
        best.shape)


@triton.jit
def _merged_topk(CHUNK_MAX, GROUP_MAX, K, R, TOPK, g, row, n, d, k, heads,
                 skb, skh, skn, LOG_C: tl.constexpr, LOG_G: tl.constexpr,
                 LOG_REST: tl.constexpr, LOG_K: tl.constexpr,
                 LOG_L: tl.constexpr, BLOCK_D: tl.constexpr,
                 PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """The ``k`` largest keys of landmark ``row`` (token indices) from its
    maxima of chunks of ``2**LOG_C`` tokens (row ``row`` of [G, m,
    chunks]): the ``K_PAD`` chunks of the largest maxima (ties to the lower
    chunk; ``LOG_G`` > 0: among the chunks of the ``K_PAD`` groups of
    ``2**LOG_G`` chunks of the largest maxima, rows of [G, m, groups]) hold
    the ``K_PAD`` largest keys, as no key of another chunk beats the
    maximum of each of them; their logits are recomputed as the keys pass
    computed them, and the ``k`` largest kept. The groups' maxima ``K_PAD``
    at a time, a last, partial tile (``LOG_REST`` >= 0; else it is one of
    the others) of ``2**LOG_REST``."""
    K_PAD: tl.constexpr = 2**LOG_K
    C: tl.constexpr = 2**LOG_C
    G: tl.constexpr = 2**LOG_G
    chunks = (n + C - 1) >> LOG_C
    groups = (chunks + G - 1) >> LOG_G
    maxima = CHUNK_MAX + row.to(tl.int64) * chunks
    tops = maxima  # of the groups
    if LOG_G > 0:
        tops = GROUP_MAX + row.to(tl.int64) * groups
    offs_k = tl.arange(0, K_PAD)
    # The K_PAD groups of chunks of the largest maxima.
    best = tl.full([K_PAD], LOWEST, tl.int64)
    full = groups
    if LOG_REST >= 0:
        full = groups // K_PAD * K_PAD
    for s0 in range(0, full, K_PAD):
        best = _fold_chunks(best, tops, s0 + offs_k, s0 + offs_k < groups,
                            LOG_K)
    if LOG_REST >= 0:
        best = _fold_few(best, tops, full, groups, LOG_REST, LOG_K)
    if LOG_G > 0:  # their chunks: the K_PAD of the largest maxima
        group = _token_of(best)
        best = tl.full([K_PAD], LOWEST, tl.int64)
        for i in range(G):
            index = group * G + i
            best = _fold_chunks(best, maxima, index,
                                (group < groups) & (index < chunks), LOG_K)
    if LOG_C > 0:
        # Their tokens, the i-th of every chunk at a time: logits
        # recomputed (the landmark in every row of the keys pass's
        # product). Chunks of one token: the keys already are the tokens'.
        chunk = _token_of(best)
        offs_d, d_mask = _head_dim(d, BLOCK_D)
        marks = tl.load(
            R + row.to(tl.int64) * d + offs_d[None, :] +
            tl.zeros([2**LOG_L, 1], tl.int64),
            mask=d_mask[None, :], other=0.0)
        k_base = K + _group_base(g, heads, skb, skh)
        best = tl.full([K_PAD], LOWEST, tl.int64)
        for i in range(C):
            token = chunk * C + i
            valid = (chunk < chunks) & (token < n)
            keys = _load_rows(k_base, token, valid, skn, offs_d, d_mask)
            logits = tl.reshape(
                _first_rows(_logits(marks, keys, PRECISION, UPCAST), LOG_L,
                            0), [K_PAD])
            logits = tl.gather(logits, offs_k, 0)  # one copy, not one a row
            best = _fold_topk(best, _ranked(logits, token, valid), 0, LOG_K,
                              LOG_K, False)
    # The k largest are the last k (ascending).
    tl.store(
        TOPK + row.to(tl.int64) * k + offs_k - (K_PAD - k),
        _token_of(best),
        mask=offs_k >= K_PAD - k)


@triton.jit
def _fill(ptr, start, end, value, BLOCK_I: tl.constexpr):
    """``ptr[start:end] = value`` (int32)."""
    for i0 in range(start, end, BLOCK_I):
        offs = i0 + tl.arange(0, BLOCK_I)
        tl.store(ptr + offs, tl.full([BLOCK_I], value, tl.int32),
                 mask=offs < end)


@triton.jit
def _split_counts(COUNTS, g, splits, split, offs_e, e_mask,
                  BLOCK_S: tl.constexpr, M_PAD: tl.constexpr):
    """Queries of experts ``offs_e`` of group ``g``: in all splits, and in
    the splits before ``split`` (``BLOCK_S`` splits at a time)."""
    offs_s = tl.arange(0, BLOCK_S)
    totals = tl.zeros(offs_e.shape, tl.int32)
    earlier = tl.zeros(offs_e.shape, tl.int32)
    for s0 in range(0, splits, BLOCK_S):
        rows = s0 + offs_s
        counts = tl.load(
            COUNTS + (g * splits + rows)[:, None] * M_PAD + offs_e[None, :],
            mask=(rows < splits)[:, None] & e_mask[None, :],
            other=0)
        totals += tl.sum(counts, 0)
        earlier += tl.sum(tl.where((rows < split)[:, None], counts, 0), 0)
    return totals, earlier


@triton.jit
def _blocks_of(counts, BLOCK: tl.constexpr):
    """Blocks of ``BLOCK`` slots that experts of ``counts`` queries take."""
    return (counts + BLOCK - 1) // BLOCK


@triton.jit
def _expert_blocks(COUNTS, SLOTS, BLOCK_EXPERT, g, e, m, splits,
                   slots_per_group, num_blocks, BLOCK: tl.constexpr,
                   BLOCK_S: tl.constexpr, BLOCK_I: tl.constexpr,
                   M_PAD: tl.constexpr):
    """Expert ``e``'s blocks (after those of the experts before it) marked
    ``e``, its slots past its queries -1; the last expert also marks the
    blocks no expert uses."""
    offs_e = tl.arange(0, M_PAD)
    totals, _ = _split_counts(COUNTS, g, splits, 0, offs_e, offs_e < M_PAD,
                              BLOCK_S, M_PAD)
    blocks = _blocks_of(totals, BLOCK)
    first_block = tl.sum(tl.where(offs_e < e, blocks, 0), 0)
    end_block = first_block + tl.sum(tl.where(offs_e == e, blocks, 0), 0)
    group_blocks = BLOCK_EXPERT + g.to(tl.int64) * num_blocks
    for b0 in range(first_block, end_block, BLOCK_I):
        offs_b = b0 + tl.arange(0, BLOCK_I)
        tl.store(group_blocks + offs_b,
                 tl.zeros([BLOCK_I], tl.int32) + e,
                 mask=offs_b < end_block)
    group_slots = SLOTS + g.to(tl.int64) * slots_per_group
    count = tl.sum(tl.where(offs_e == e, totals, 0), 0)
    _fill(group_slots, first_block * BLOCK + count, end_block * BLOCK, -1,
          BLOCK_I)
    if e == m - 1:
        used = tl.sum(blocks, 0)
        _fill(group_blocks, used, num_blocks, -1, BLOCK_I)
        _fill(group_slots, used * BLOCK, slots_per_group, -1, BLOCK_I)


@triton.jit
def _popcount(x):
    """The set bits of each element of ``x`` (uint32)."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return (x * 0x01010101) >> 24


@triton.jit
def _ballot(pred, lanes):
    """Per row of ``pred`` [rows, 32]: the bit mask of its lanes where it
    holds (``lanes``: lane ``l``'s bit, uint32 [1, 32])."""
    return tl.sum(tl.where(pred, lanes, 0), 1)


@triton.jit
def _split_slots(EXPERT, COUNTS, SLOTS, g, split, n, m, chunk, splits,
                 slots_per_group, BLOCK: tl.constexpr, BLOCK_S: tl.constexpr,
                 ROWS: tl.constexpr, LOG_E: tl.constexpr,
                 M_PAD: tl.constexpr):
    """The queries of split ``split`` written to their slots: an expert's
    queries fill its blocks in token order, so a query's slot is its
    expert's first slot, plus its expert's queries in earlier splits, plus
    its rank among them in this split (experts ``2**LOG_E`` at a time).
    A tile of ``ROWS`` x 32 queries (in token order, row by row) ranks
    them by bit masks, a row's 32 lanes to a uint32: the lanes of a row
    whose expert has bit ``b`` set (a sum of their lane bits over the row)
    give, ANDed over the bits (or their complements), the lanes of each
    query's expert: its rank is the count of those before it in its row
    plus its expert's queries in the rows before (the same masks tested
    against each expert); the tile's count per expert moves each expert's
    next free slot."""
    E_TILE: tl.constexpr = 2**LOG_E
    start = split * chunk
    end = tl.minimum(start + chunk, n)
    group_slots = SLOTS + g.to(tl.int64) * slots_per_group
    ids = EXPERT + g.to(tl.int64) * n
    offs_l = tl.arange(0, 32)
    lanes = (tl.full([1, 32], 1, tl.uint32) << offs_l.to(tl.uint32)[None, :])
    below = lanes - 1  # the lanes before each lane
    offs_t = tl.arange(0, ROWS)[:, None] * 32 + offs_l[None, :]
    experts = tl.arange(0, E_TILE)[None, :]
    first_block = 0  # of the expert tile
    for e0 in range(0, m, E_TILE):
        offs_e = e0 + tl.arange(0, E_TILE)
        totals, earlier = _split_counts(COUNTS, g, splits, split, offs_e,
                                        offs_e < m, BLOCK_S, M_PAD)
        blocks = _blocks_of(totals, BLOCK)
        slot = (first_block + tl.cumsum(blocks, 0) - blocks) * BLOCK + earlier
        first_block += tl.sum(blocks, 0)
        for i0 in range(start, end, ROWS * 32):
            offs_i = i0 + offs_t
            expert = tl.load(ids + offs_i, mask=offs_i < end, other=-1) - e0
            mine = (expert >= 0) & (expert < E_TILE)
            held = _ballot(mine, lanes)[:, None]  # [ROWS, 1]
            same = tl.broadcast_to(held, offs_i.shape)  # per query
            per_expert = tl.broadcast_to(held, [ROWS, E_TILE])  # per row
            for b in tl.static_range(LOG_E):
                bit = ((expert >> b) & 1) != 0
                ones = _ballot(mine & bit, lanes)[:, None]
                same &= tl.where(bit, ones, ~ones)
                per_expert &= tl.where(((experts >> b) & 1) != 0, ones,
                                       ~ones)
            counts = _popcount(per_expert).to(tl.int32)  # [ROWS, E_TILE]
            first = slot[None, :] + tl.cumsum(counts, 0) - counts
            rank = _popcount(same & below).to(tl.int32)
            expert = tl.where(mine, expert, 0)
            tl.store(group_slots + tl.gather(first, expert, 1) + rank, offs_i,
                     mask=mine)
            slot += tl.sum(counts, 0)


@triton.jit(do_not_specialize=[
    'n', 'k', 'chunk', 'splits', 'slots_per_group', 'num_blocks'
])
def _merge(PART_O, PART_LSE, CHUNK_MAX, GROUP_MAX, COUNTS, EXPERT, K, R, VT,
           LSE_R, TOPK, SLOTS, BLOCK_EXPERT, n, m, k, d, heads, skb, skh, skn,
           chunk, splits, slots_per_group, num_blocks,
           FUSED_TOPK: tl.constexpr, BLOCK: tl.constexpr, LOG_S: tl.constexpr,
           BLOCK_I: tl.constexpr, ROWS: tl.constexpr, LOG_E: tl.constexpr,
           M_PAD: tl.constexpr, LOG_K: tl.constexpr, LOG_C: tl.constexpr,
           LOG_G: tl.constexpr, LOG_REST: tl.constexpr, LOG_L: tl.constexpr,
           BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
           UPCAST: tl.constexpr):
    """Program ``p`` of group ``g`` (grid: G, max(m, S)): for expert
    ``p < m``, its shared values and log-sum-exp, its top-k keys
    (``FUSED_TOPK``) and its blocks; for split ``p < S``, the slots of its
    queries."""
    g = tl.program_id(0)
    p = tl.program_id(1)
    if p < m:
        row = g * m + p
        part = row.to(tl.int64) * splits
        _shared_expert(PART_O, PART_LSE, VT, LSE_R, row, part, splits, d,
                       2**LOG_S, BLOCK_D, UPCAST)
        if FUSED_TOPK:
            _merged_topk(CHUNK_MAX, GROUP_MAX, K, R, TOPK, g, row, n, d, k,
                         heads, skb, skh, skn, LOG_C, LOG_G, LOG_REST, LOG_K,
                         LOG_L, BLOCK_D, PRECISION, UPCAST)
        _expert_blocks(COUNTS, SLOTS, BLOCK_EXPERT, g, p, m, splits,
                       slots_per_group, num_blocks, BLOCK, 2**LOG_S, BLOCK_I,
                       M_PAD)
    if p < splits:
        _split_slots(EXPERT, COUNTS, SLOTS, g, p, n, m, chunk, splits,
                     slots_per_group, BLOCK, 2**LOG_S, ROWS, LOG_E, M_PAD)


@triton.jit(do_not_specialize=['n', 'k', 'slots_per_group', 'num_blocks'])
def _experts_fwd(Q, K, V, R, VT, TOPK, SLOTS, BLOCK_EXPERT, OUT, LSE, n, m, k,
                 d, heads, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn,
                 slots_per_group, num_blocks, qk_scale, rl_scale,
                 BLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Output and log-sum-exp (base 2) of the queries of ``BLOCK_M``
    slots."""
    g = tl.program_id(0)
    expert, rows, row_mask, offs_d, d_mask, q = _block(
        Q, SLOTS, BLOCK_EXPERT, g, tl.program_id(1), heads, sqb, sqh, sqn, d,
        slots_per_group, num_blocks, BLOCK, BLOCK_M, BLOCK_D)
    if expert < 0:
        return
    m_i = tl.full([BLOCK_M], -float('inf'), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # Compressed keys: logits s^2 q . R, values Vt.
    for n0 in range(0, m, BLOCK_N):
        marks, values, n_mask, _, _ = _compressed_keys(
            R, VT, g, n0, m, d, offs_d, d_mask, BLOCK_N)
        logits = _dot(q, tl.trans(marks), PRECISION, UPCAST)
        logits = tl.where(n_mask[None, :], logits * rl_scale, -float('inf'))
        m_i, l_i, acc = _online_softmax(m_i, l_i, acc, logits, values,
                                        PRECISION, UPCAST)
    # Routed keys of this expert, read by index from K and V.
    k_base, v_base = _kv_bases(K, V, g, heads, skb, skh, svb, svh)
    topk_e = TOPK + (g * m + expert).to(tl.int64) * k  # the expert's row
    for n0 in range(0, k, BLOCK_N):
        n_mask, key_rows, keys, values = _routed_keys(
            topk_e, k_base, v_base, n0, k, skn, svn, offs_d, d_mask, BLOCK_N)
        logits = _dot(q, tl.trans(keys), PRECISION, UPCAST)
        logits = tl.where(n_mask[None, :], logits * qk_scale, -float('inf'))
        m_i, l_i, acc = _online_softmax(m_i, l_i, acc, logits, values,
                                        PRECISION, UPCAST)
    out_rows = g.to(tl.int64) * n + rows
    o_offs, o_mask = _row_offsets(out_rows, row_mask, d, offs_d, d_mask)
    tl.store(
        OUT + o_offs,
        _cast(acc * (1.0 / l_i)[:, None], OUT.dtype.element_ty, UPCAST),
        mask=o_mask)
    tl.store(LSE + out_rows, m_i + tl.log2(l_i), mask=row_mask)


@triton.jit
def _compressed_grads(q, do, marks, values, lse, delta, pair_mask, rl_scale,
                      scale, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Through the compressed keys ``marks`` (values ``values``) of the
    queries ``q``: their probabilities ``P``, score gradients ``dS`` (the
    logits' ``s^2`` included) and ``dS R``, the queries' part of ``dq``."""
    p = _probs(q, marks, lse, pair_mask, rl_scale, PRECISION, UPCAST)
    ds = _score_grad(p, do, values, delta, PRECISION, UPCAST) * (scale * scale)
    return p, ds, _dot(_cast(ds, marks.dtype, UPCAST), marks, PRECISION,
                       UPCAST)


@triton.jit
def _tile_bwd(Q, K, V, R, VT, TOPK, SLOTS, BLOCK_EXPERT, OUT, LSE, g, tile, n,
              m, k, d, heads, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn,
              slots_per_group, num_blocks, qk_scale, rl_scale, DO, DQ_ACC,
              DK_ACC, DV_ACC, DR, DVT, r_offs, r_mask, l_mask, d_marks,
              d_shared, sob, soh, son, scale, BLOCK: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, SUM_LANDMARKS: tl.constexpr,
              PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """The backward of the ``BLOCK_M`` slots ``tile`` of group ``g``: their
    ``dq`` (float32, stored), their routed keys' ``dk``, ``dv`` (float32,
    added atomically) and the compressed keys' ``dR``, ``dVt``: with
    ``SUM_LANDMARKS``, every landmark in one tile (rows ``r_offs`` of R and
    Vt, read again a tile, from cache, rather than held in registers),
    added into the program's ``d_marks``, ``d_shared``, which it returns;
    else in tiles of ``BLOCK_N``, added atomically into ``DR``, ``DVT``."""
    expert, rows, row_mask, offs_d, d_mask, q = _block(
        Q, SLOTS, BLOCK_EXPERT, g, tile, heads, sqb, sqh, sqn, d,
        slots_per_group, num_blocks, BLOCK, BLOCK_M, BLOCK_D)
    if expert >= 0:
        do = _load_rows(DO + _group_base(g, heads, sob, soh), rows, row_mask,
                        son, offs_d, d_mask)
        out_rows = g.to(tl.int64) * n + rows
        o_offs, o_mask = _row_offsets(out_rows, row_mask, d, offs_d, d_mask)
        out = tl.load(OUT + o_offs, mask=o_mask, other=0.0)
        delta = tl.sum(do.to(tl.float32) * out.to(tl.float32), 1)
        lse = tl.load(LSE + out_rows, mask=row_mask, other=0.0)
        # Compressed keys: dq += s^2 dS R, dR += s^2 dS^T q, dVt += P^T dO.
        if SUM_LANDMARKS:  # summed over the program's tiles, whatever expert
            marks = tl.load(R + r_offs, mask=r_mask, other=0.0)
            p_c, ds_c, dq = _compressed_grads(
                q, do, marks, tl.load(VT + r_offs, mask=r_mask, other=0.0),
                lse, delta, row_mask[:, None] & l_mask[None, :], rl_scale,
                scale, PRECISION, UPCAST)
            d_marks += _dot(_cast(tl.trans(ds_c), q.dtype, UPCAST), q,
                            PRECISION, UPCAST)
            d_shared += _dot(_cast(tl.trans(p_c), do.dtype, UPCAST), do,
                             PRECISION, UPCAST)
        else:
            dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
            for n0 in range(0, m, BLOCK_N):
                marks, values, n_mask, c_offs, c_mask = _compressed_keys(
                    R, VT, g, n0, m, d, offs_d, d_mask, BLOCK_N)
                p, ds, dq_c = _compressed_grads(
                    q, do, marks, values, lse, delta,
                    row_mask[:, None] & n_mask[None, :], rl_scale, scale,
                    PRECISION, UPCAST)
                dq += dq_c
                _add_key_grads(DR, DVT, c_offs, c_mask, ds, p, q, do,
                               PRECISION, UPCAST)
        # Routed keys of this expert: their dk, dv added atomically (a key
        # may be routed by several experts, an expert span several blocks).
        k_base, v_base = _kv_bases(K, V, g, heads, skb, skh, svb, svh)
        topk_e = TOPK + (g * m + expert).to(tl.int64) * k  # the expert's row
        for n0 in range(0, k, BLOCK_N):
            n_mask, key_rows, keys, values = _routed_keys(
                topk_e, k_base, v_base, n0, k, skn, svn, offs_d, d_mask,
                BLOCK_N)
            p = _probs(q, keys, lse, row_mask[:, None] & n_mask[None, :],
                       qk_scale, PRECISION, UPCAST)
            ds = _score_grad(p, do, values, delta, PRECISION, UPCAST) * scale
            dq += _dot(_cast(ds, keys.dtype, UPCAST), keys, PRECISION, UPCAST)
            kv_offs, kv_mask = _row_offsets(
                g.to(tl.int64) * n + key_rows, n_mask, d, offs_d, d_mask)
            _add_key_grads(DK_ACC, DV_ACC, kv_offs, kv_mask, ds, p, q, do,
                           PRECISION, UPCAST)
        tl.store(DQ_ACC + o_offs, dq, mask=o_mask)
    return d_marks, d_shared


@triton.jit(do_not_specialize=['n', 'k', 'slots_per_group', 'num_blocks'])
def _experts_bwd(Q, K, V, R, VT, TOPK, SLOTS, BLOCK_EXPERT, OUT, LSE, n, m, k,
                 d, heads, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn,
                 slots_per_group, num_blocks, qk_scale, rl_scale, DO, DQ_ACC,
                 DK_ACC, DV_ACC, DR, DVT, sob, soh, son, scale,
                 BLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, M_PAD: tl.constexpr,
                 BLOCK_D: tl.constexpr, SUM_LANDMARKS: tl.constexpr,
                 PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Gradients through the expert attention of the group's ``BLOCK_M``
    slot tiles ``part, part + parts, ..`` (grid: group, parts; strided, so
    the tiles of unused blocks, at the layout's end, are shared out): per
    tile ``dq`` (float32, stored) and the routed keys' ``dk``, ``dv``
    (float32, added atomically); the compressed keys' ``dR``, ``dVt``
    (float32, added atomically) with ``SUM_LANDMARKS`` summed over the
    program's tiles in registers and added once (``parts`` adds a
    landmark, not one a tile), else added a tile."""
    g = tl.program_id(0)
    part, parts = tl.program_id(1), tl.num_programs(1)
    tiles = slots_per_group // BLOCK_M
    if SUM_LANDMARKS:
        offs_d, d_mask = _head_dim(d, BLOCK_D)
        r_offs, r_mask, l_mask = _landmark_rows(g, tl.arange(0, M_PAD), m, d,
                                                offs_d, d_mask)
        d_marks = tl.zeros([M_PAD, BLOCK_D], tl.float32)
        d_shared = tl.zeros([M_PAD, BLOCK_D], tl.float32)
        for tile in range(part, tiles, parts):
            d_marks, d_shared = _tile_bwd(
                Q, K, V, R, VT, TOPK, SLOTS, BLOCK_EXPERT, OUT, LSE, g, tile,
                n, m, k, d, heads, sqb, sqh, sqn, skb, skh, skn, svb, svh,
                svn, slots_per_group, num_blocks, qk_scale, rl_scale, DO,
                DQ_ACC, DK_ACC, DV_ACC, DR, DVT, r_offs, r_mask, l_mask,
                d_marks, d_shared, sob, soh, son, scale, BLOCK, BLOCK_M,
                BLOCK_N, BLOCK_D, SUM_LANDMARKS, PRECISION, UPCAST)
        _add(DR + r_offs, d_marks, r_mask)
        _add(DVT + r_offs, d_shared, r_mask)
    else:  # each tile adds its dR, dVt: no offsets nor sums to pass (0)
        for tile in range(part, tiles, parts):
            _tile_bwd(Q, K, V, R, VT, TOPK, SLOTS, BLOCK_EXPERT, OUT, LSE, g,
                      tile, n, m, k, d, heads, sqb, sqh, sqn, skb, skh, skn,
                      svb, svh, svn, slots_per_group, num_blocks, qk_scale,
                      rl_scale, DO, DQ_ACC, DK_ACC, DV_ACC, DR, DVT, 0, 0, 0,
                      0.0, 0.0, sob, soh, son, scale, BLOCK, BLOCK_M, BLOCK_N,
                      BLOCK_D, SUM_LANDMARKS, PRECISION, UPCAST)


@triton.jit(do_not_specialize=['n'])
def _shared_bwd(K, V, R, VT, LSE_R, DR, DVT, DK_ACC, DV_ACC, DK, DV, n, m, d,
                heads, skb, skh, skn, svb, svh, svn, qk_scale, scale,
                BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
                BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                UPCAST: tl.constexpr):
    """The shared expert's backward for ``BLOCK_N`` keys (landmarks
    ``BLOCK_L`` at a time): ``dR`` (added atomically), and the final
    ``dk``, ``dv`` of these keys."""
    g = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < n
    offs_d, d_mask = _head_dim(d, BLOCK_D)
    keys = _load_rows(K + _group_base(g, heads, skb, skh), offs_n.to(tl.int64),
                      n_mask, skn, offs_d, d_mask)
    values = _load_rows(V + _group_base(g, heads, svb, svh),
                        offs_n.to(tl.int64), n_mask, svn, offs_d, d_mask)
    kv_offs, kv_mask = _row_offsets(
        g.to(tl.int64) * n + offs_n, n_mask, d, offs_d, d_mask)
    dk = tl.load(DK_ACC + kv_offs, mask=kv_mask, other=0.0)
    dv = tl.load(DV_ACC + kv_offs, mask=kv_mask, other=0.0)
    for l0 in range(0, m, BLOCK_L):
        offs_l = l0 + tl.arange(0, BLOCK_L)
        r_offs, r_mask, l_mask = _landmark_rows(g, offs_l, m, d, offs_d,
                                                d_mask)
        marks = tl.load(R + r_offs, mask=r_mask, other=0.0)
        lse = tl.load(LSE_R + g * m + offs_l, mask=l_mask, other=0.0)
        p = _probs(marks, keys, lse, l_mask[:, None] & n_mask[None, :],
                   qk_scale, PRECISION, UPCAST)
        dvt = tl.load(DVT + r_offs, mask=r_mask, other=0.0)
        delta = tl.sum(
            dvt * tl.load(VT + r_offs, mask=r_mask, other=0.0).to(tl.float32),
            1)
        dvt = _cast(dvt, values.dtype, UPCAST)
        ds = _score_grad(p, dvt, values, delta, PRECISION, UPCAST) * scale
        _add(DR + r_offs,
             _dot(_cast(ds, keys.dtype, UPCAST), keys, PRECISION, UPCAST),
             r_mask)
        dk += _dot(
            _cast(tl.trans(ds), marks.dtype, UPCAST), marks, PRECISION, UPCAST)
        dv += _dot(
            _cast(tl.trans(p), dvt.dtype, UPCAST), dvt, PRECISION, UPCAST)
    tl.store(
        DK + kv_offs, _cast(dk, DK.dtype.element_ty, UPCAST), mask=kv_mask)
    tl.store(
        DV + kv_offs, _cast(dv, DV.dtype.element_ty, UPCAST), mask=kv_mask)


@triton.jit(do_not_specialize=['n', 'hgt', 'wid', 'first'])
def _pool_bwd(DQ_ACC, DR, DQ, n, m, d, first, hgt, wid, ph, pw,
              BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
              UPCAST: tl.constexpr):
    """``dq`` of ``BLOCK_N`` tokens: the attention's part plus, for a patch,
    ``dR / bin size`` of each of the (at most 2 x 2) bins holding it;
    written in its dtype."""
    g = tl.program_id(0)
    offs_t = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d, d_mask = _head_dim(d, BLOCK_D)
    offs, mask = _row_offsets(
        g.to(tl.int64) * n + offs_t, offs_t < n, d, offs_d, d_mask)
    dq = tl.load(DQ_ACC + offs, mask=mask, other=0.0)
    patch = offs_t - first
    is_patch = (patch >= 0) & (patch < hgt * wid) & (offs_t < n)
    patch = tl.where(is_patch, patch, 0).to(tl.uint32)
    row = patch // wid.to(tl.uint32)
    bi, two_rows, rows0, rows1 = _axis_bins(row, hgt, ph)
    bj, two_cols, cols0, cols1 = _axis_bins(patch - row * wid, wid, pw)
    for di in tl.static_range(2):
        for dj in tl.static_range(2):
            held = is_patch
            size = rows0
            if di == 1:
                held = held & two_rows
                size = rows1
            if dj == 1:
                held = held & two_cols
                size = size * cols1
            else:
                size = size * cols0
            j = (bi + di) * pw + bj + dj
            # dR / bin size, as a product with the size's reciprocal.
            weight = tl.where(held, 1.0 / size.to(tl.float32), 0.0)
            r_offs, r_mask = _row_offsets(
                (g * m + j).to(tl.int64), held, d, offs_d, d_mask)
            dq += weight[:, None] * tl.load(
                DR + r_offs, mask=r_mask, other=0.0)
    tl.store(DQ + offs, _cast(dq, DQ.dtype.element_ty, UPCAST), mask=mask)


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
# The launches of a forward and a backward, in order.
KERNELS = ('pool', 'keys', 'merge', 'experts_fwd', 'experts_bwd', 'shared_bwd',
           'pool_bwd')


class _Config:
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
        self.block_l = 16  # landmarks per tile of the keys pass
        # The fused top-k's chunks of 2**log_c tokens, in groups of
        # 2**log_g (a key tile holds whole groups).
        self.log_c, self.log_g = _chunking(n, self.k_pad, self.keys_n)
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
        # ptxas (a release per triton release) may hold a kernel below the
        # registers it needs, and spill: 128 a thread for a block of 8 warps
        # at head_dim 128 (ptxas 12.9, triton >= 3.8), and for _merge
        # (triton 3.6). Those take up to MAX_REGISTERS; the others keep
        # ptxas's choice (a cap there makes it trade occupancy for
        # registers, and spills _experts_bwd at head_dim 64 on sm_89).
        # (_merge's cap is set with its warps, once the splits are known.)
        # So does _experts_bwd where its program holds its dR, dVt sums.
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
        """The grid of ``kernel`` (one of :data:`KERNELS`)."""
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
        isinstance(fn, InterpretedFunction) for fn in (_experts_fwd, tl.zeros))


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


def _config(q: Tensor, m: int, k: int) -> _Config:
    """The :class:`_Config` of a call on ``q`` [B, heads, N, d]."""
    b, heads, n, d = q.shape
    return _Config(n, m, d, min(k, n), b * heads, q.dtype, *_target())


def _strides(t: Tensor) -> Tuple[int, int, int]:
    """Batch, head and token strides of a [B, heads, N, d] tensor."""
    return t.stride(0), t.stride(1), t.stride(2)


def _block_args(q, k, v, marks, shared_values, topk_index, slots, block_expert,
                out, lse, cfg: _Config) -> tuple:
    """The arguments that ``_experts_fwd`` and ``_experts_bwd`` share."""
    b, heads, n, d = q.shape
    scale = d**-0.5
    return (q, k, v, marks, shared_values, topk_index, slots, block_expert,
            out, lse, n, marks.shape[1], topk_index.shape[-1], d, heads,
            *_strides(q), *_strides(k), *_strides(v), cfg.slots,
            cfg.num_blocks, scale * LOG2E.value, scale * scale * LOG2E.value)


Sizes = Tuple[int, int, int, int, int, int]  # hgt, wid, first, ph, pw, topk


def _forward(q: Tensor, k: Tensor, v: Tensor, sizes: Sizes,
             expert: Optional[Tensor], topk_index: Optional[Tensor]):
    hgt, wid, first, ph, pw, topk = sizes
    b, heads, n, d = q.shape
    g, m = b * heads, ph * pw
    cfg = _config(q, m, topk)
    f32, i32, i64 = torch.float32, torch.int32, torch.int64
    qk_scale = d**-0.5 * LOG2E.value
    marks = q.new_empty(g, m, d)
    _pool[cfg.grid('pool')](
        q, marks, m, d, heads, first, hgt, wid, ph, pw, *_strides(q),
        BLOCK_P=cfg.block_p, BLOCK_D=cfg.block_d, UPCAST=cfg.upcast,
        **cfg.launch('pool'))
    fused = cfg.fused_topk and topk_index is None
    store_logits = not cfg.fused_topk and topk_index is None
    ids = q.new_empty(g, n, dtype=i32)
    counts = q.new_empty(g, cfg.splits, cfg.m_pad, dtype=i32)
    part_o = q.new_empty(g, m, cfg.splits, d, dtype=f32)
    part_lse = q.new_empty(g, m, cfg.splits, dtype=f32)
    chunk_max = q.new_empty((g, m, cfg.chunks) if fused else (0, ),
                            dtype=i32)
    group_max = q.new_empty(
        (g, m, cfg.chunk_groups) if fused and cfg.log_g else (0, ),
        dtype=i32)
    key_logits = q.new_empty((g, m, n) if store_logits else (0, ), dtype=f32)
    _keys[cfg.grid('keys')](
        q, k, v, marks, ids if expert is None else expert, ids, counts,
        part_o, part_lse, chunk_max, group_max, key_logits, n, m, d, heads,
        cfg.chunk, *_strides(q), *_strides(k), *_strides(v), qk_scale,
        ROUTE=expert is None, FUSED_TOPK=fused, STORE_LOGITS=store_logits,
        LOG_L=_log2(cfg.block_l), LOG_N=_log2(cfg.keys_n), LOG_C=cfg.log_c,
        LOG_G=cfg.log_g, BLOCK_Q=cfg.block_q, E_TILE=cfg.e_tile,
        M_PAD=cfg.m_pad, BLOCK_D=cfg.block_d, PRECISION=cfg.precision,
        UPCAST=cfg.upcast, **cfg.launch('keys'))
    if topk_index is not None:  # given: an output must not alias an input
        topk_index = topk_index.clone(memory_format=torch.contiguous_format)
    elif store_logits:
        topk_index = key_logits.topk(cfg.k, dim=-1, sorted=False).indices
    else:
        topk_index = q.new_empty(g, m, cfg.k, dtype=i64)
    shared_values = torch.empty_like(marks)
    lse_shared = q.new_empty(g, m, dtype=f32)
    slots = q.new_empty(g, cfg.slots, dtype=i32)
    block_expert = q.new_empty(g, cfg.num_blocks, dtype=i32)
    _merge[cfg.grid('merge')](
        part_o, part_lse, chunk_max, group_max, counts, ids, k, marks,
        shared_values, lse_shared, topk_index, slots, block_expert, n, m,
        cfg.k, d, heads,
        *_strides(k), cfg.chunk, cfg.splits, cfg.slots, cfg.num_blocks,
        FUSED_TOPK=fused, BLOCK=cfg.block, LOG_S=_log2(cfg.block_s),
        BLOCK_I=cfg.block_i, ROWS=cfg.sort_rows, LOG_E=_log2(cfg.e_tile),
        M_PAD=cfg.m_pad, LOG_K=_log2(cfg.k_pad), LOG_C=cfg.log_c,
        LOG_G=cfg.log_g, LOG_REST=cfg.log_rest, LOG_L=_log2(cfg.block_l),
        BLOCK_D=cfg.block_d, PRECISION=cfg.precision, UPCAST=cfg.upcast,
        **cfg.launch('merge'))
    out = q.new_empty(b, heads, n, d)
    lse = q.new_empty(g, n, dtype=f32)
    _experts_fwd[cfg.grid('experts_fwd')](
        *_block_args(q, k, v, marks, shared_values, topk_index, slots,
                     block_expert, out, lse, cfg),
        BLOCK=cfg.block, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_D=cfg.block_d, PRECISION=cfg.precision, UPCAST=cfg.upcast,
        **cfg.launch('experts_fwd'))
    return (out, lse, marks, shared_values, lse_shared, topk_index, ids, slots,
            block_expert)


def _forward_fake(q: Tensor, k: Tensor, v: Tensor, sizes: Sizes):
    hgt, wid, first, ph, pw, topk = sizes
    b, heads, n, d = q.shape
    g, m = b * heads, ph * pw
    cfg = _config(q, m, topk)
    f32, i32 = torch.float32, torch.int32
    return (q.new_empty(b, heads, n, d), q.new_empty(g, n, dtype=f32),
            q.new_empty(g, m, d), q.new_empty(g, m, d),
            q.new_empty(g, m, dtype=f32),
            q.new_empty(g, m, cfg.k, dtype=torch.int64),
            q.new_empty(g, n, dtype=i32), q.new_empty(g, cfg.slots, dtype=i32),
            q.new_empty(g, cfg.num_blocks, dtype=i32))


Outputs = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                Tensor]


@torch.library.custom_op('mmseg_mita::mita_triton_fwd', mutates_args=())
def mita_triton_fwd(q: Tensor, k: Tensor, v: Tensor, hgt: int, wid: int,
                    first: int, ph: int, pw: int, topk: int,
                    expert: Optional[Tensor],
                    topk_index: Optional[Tensor]) -> Outputs:
    """The forward: ``(out, lse, landmarks, shared_values, lse_shared,
    topk_index, expert, slots, block_expert)``; ``expert`` [G, N] and
    ``topk_index`` [G, m, k], when given, replace the routing."""
    return _forward(q, k, v, (hgt, wid, first, ph, pw, topk), expert,
                    topk_index)


@mita_triton_fwd.register_fake
def _(q, k, v, hgt, wid, first, ph, pw, topk, expert, topk_index):
    return _forward_fake(q, k, v, (hgt, wid, first, ph, pw, topk))


@torch.library.custom_op('mmseg_mita::mita_triton_bwd', mutates_args=())
def mita_triton_bwd(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor,
                    out: Tensor, lse: Tensor, landmarks: Tensor,
                    shared_values: Tensor, lse_shared: Tensor,
                    topk_index: Tensor, slots: Tensor, block_expert: Tensor,
                    hgt: int, wid: int, first: int,
                    pw: int) -> Tuple[Tensor, Tensor, Tensor]:
    """The backward: ``(dq, dk, dv)``."""
    return _backward(grad_out, q, k, v, out, lse, landmarks, shared_values,
                     lse_shared, topk_index, slots, block_expert,
                     (hgt, wid, first, pw))


def _backward(grad_out, q, k, v, out, lse, landmarks, shared_values,
              lse_shared, topk_index, slots, block_expert, sizes):
    hgt, wid, first, pw = sizes
    b, heads, n, d = q.shape
    g, m = landmarks.shape[:2]
    if grad_out.stride(-1) != 1:  # e.g. expanded by the backward of a sum
        grad_out = grad_out.contiguous()
    cfg = _config(q, m, topk_index.shape[-1])
    scale = d**-0.5
    # Every float32 sum added into with atomics: one zero-filled buffer.
    sums = q.new_zeros(2 * g * (n + m) * d, dtype=torch.float32)
    dk_sum, dv_sum, d_marks, d_shared = sums.split(
        [g * n * d, g * n * d, g * m * d, g * m * d])
    dq_sum = q.new_empty(g * n * d, dtype=torch.float32)
    dq, dk, dv = (
        torch.empty_like(t, memory_format=torch.contiguous_format)
        for t in (q, k, v))
    _experts_bwd[cfg.grid('experts_bwd')](
        *_block_args(q, k, v, landmarks, shared_values, topk_index, slots,
                     block_expert, out, lse, cfg),
        grad_out, dq_sum, dk_sum, dv_sum, d_marks, d_shared,
        *_strides(grad_out), scale, BLOCK=cfg.block, BLOCK_M=cfg.block_m_bwd,
        BLOCK_N=cfg.block_n_bwd, M_PAD=cfg.m_pad, BLOCK_D=cfg.block_d,
        SUM_LANDMARKS=cfg.sum_landmarks, PRECISION=cfg.precision,
        UPCAST=cfg.upcast, **cfg.launch('experts_bwd'))
    _shared_bwd[cfg.grid('shared_bwd')](
        k, v, landmarks, shared_values, lse_shared, d_marks, d_shared, dk_sum,
        dv_sum, dk, dv, n, m, d, heads, *_strides(k), *_strides(v),
        scale * LOG2E.value, scale, BLOCK_N=cfg.shared_n,
        BLOCK_L=cfg.block_l, BLOCK_D=cfg.block_d, PRECISION=cfg.precision,
        UPCAST=cfg.upcast, **cfg.launch('shared_bwd'))
    _pool_bwd[cfg.grid('pool_bwd')](
        dq_sum, d_marks, dq, n, m, d, first, hgt, wid, m // pw, pw,
        BLOCK_N=cfg.pool_n, BLOCK_D=cfg.block_d, UPCAST=cfg.upcast,
        **cfg.launch('pool_bwd'))
    return dq, dk, dv


@mita_triton_bwd.register_fake
def _(grad_out, q, k, v, *args):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


def _setup_context(ctx, inputs, output):
    q, k, v, hgt, wid, first, _, pw = inputs[:8]
    (out, lse, landmarks, shared_values, lse_shared, topk_index, _, slots,
     block_expert) = output
    ctx.save_for_backward(q, k, v, out, lse, landmarks, shared_values,
                          lse_shared, topk_index, slots, block_expert)
    # Only ``out`` has a gradient: no zeros for the others.
    ctx.mark_non_differentiable(lse, landmarks, shared_values, lse_shared)
    ctx.set_materialize_grads(False)
    ctx.sizes = (hgt, wid, first, pw)


def _autograd_backward(ctx, grad_out, *unused):
    grads = mita_triton_bwd(grad_out, *ctx.saved_tensors, *ctx.sizes)
    return (*grads, None, None, None, None, None, None, None, None)


mita_triton_fwd.register_autograd(
    _autograd_backward, setup_context=_setup_context)


def _run(q: Tensor, k: Tensor, v: Tensor, plan: MiTAPlan,
         expert: Optional[Tensor], topk_index: Optional[Tensor]) -> Tensor:
    dtype = compute_dtype(q, v)
    q, k, v = (
        t.to(dtype) if t.stride(-1) == 1 else t.to(dtype).contiguous()
        for t in (q, k, v))
    (hgt, wid), (ph, pw) = plan.hw, plan.pool_size
    with torch.autocast(q.device.type, enabled=False):
        return mita_triton_fwd(q, k, v, hgt, wid, plan.first_pooled, ph, pw,
                               plan.topk, expert, topk_index)[0]


def mita_triton(q: Tensor, k: Tensor, v: Tensor, plan: MiTAPlan) -> Tensor:
    """The triton backend's run: MiTA (default variant: one routed expert
    per query, shared and routed experts, either landmark convention) of
    ``q``, ``k``, ``v`` [B, heads, N, d] for the call's ``plan``, inputs
    within ``BACKEND``'s declaration. Returns [B, heads, N, d] in the
    compute dtype."""
    return _run(q, k, v, plan, None, None)


def mita_triton_routed(q: Tensor, k: Tensor, v: Tensor, plan: MiTAPlan,
                       expert: Tensor, topk_index: Tensor) -> Tensor:
    """:func:`mita_triton` with the routing given (for the low-precision
    tests, which hold it fixed): ``expert`` [G, N] and ``topk_index``
    [G, m, plan.topk] (int64) replace the argmax and the top-k."""
    return _run(q, k, v, plan, expert.contiguous(), topk_index.contiguous())


def _interpreter_reasons(q: Tensor) -> List[str]:
    if q.device.type == 'cpu' and not interpreted():
        return ['runs on CPU tensors only in Triton\'s interpreter: set '
                'TRITON_INTERPRET=1 before triton is first imported (slow, '
                'for tests)']
    return []


BACKEND = MiTABackend('triton', mita_triton,
                      dtypes=(torch.float32, ) + HALF_DTYPES,
                      max_head_dim=128, max_experts_per_query=1,
                      ablations=False, dropout=False, requires=('triton', ),
                      checks=_interpreter_reasons)
