"""MiTA (default variant) as one fused Triton pipeline (CUDA; CPU through
``TRITON_INTERPRET=1``), shared part included.

Per group ``g = (batch, head)``, ``s = d ** -0.5`` (spec:
:func:`~.naive.naive_mita`), the forward is FOUR launches:

1. ``_landmarks_fwd``, one program per (group, ``BLOCK_L`` landmarks):
   pools its landmarks ``R`` from the query grid (a 0/1 bin-membership
   matrix times the patch queries, over the patch rows its bins touch,
   divided by the bin size: PyTorch's adaptive bins, which may overlap),
   then one pass over the keys: ``R K^T`` is stored (``key_logits``, for the
   top-k) and an online softmax of ``s R K^T`` accumulates the shared values
   ``Vt`` and their log-sum-exp (saved for the backward);
2. ``torch.topk(key_logits, min(topk, N), sorted=False)`` (one ATen op);
3. ``_route_and_sort``, one program per group: the routing argmax of
   ``q . R`` (first index on ties) and a counting sort of the group's
   queries by expert, ``CHUNK`` queries at a time: pass 1 routes and
   counts, pass 2 ranks each query stably (cumsum of a one-hot
   [CHUNK, M_PAD]). One program per group keeps the sort exact and free of
   a second launch; its serial passes grow with N (the one cost that
   does, at large N and few groups). Fixed-capacity layout: a
   group has ``NB = N // BLOCK + min(m, N)`` blocks of ``BLOCK`` slots (an
   expert with ``c`` queries takes ``ceil(c / BLOCK)`` consecutive blocks,
   in expert order; ``sum ceil(c_e / BLOCK) <= N / BLOCK + #non-empty``);
   ``slots`` maps slot -> query (-1 empty), ``block_expert`` block ->
   expert (-1 unused);
4. ``_experts_fwd``, one program per block: ONE online softmax (float32,
   base 2) over the ``m`` compressed logits ``s^2 q . R`` (recomputed from
   ``R``: cheaper than storing [G, N, m]) with values ``Vt`` and the
   expert's ``k`` routed keys, read by index from K and V; writes the output
   and its log-sum-exp.

Backward (flash-style: probabilities recomputed from the saved
log-sum-exp), THREE launches after ONE zero-filled float32 buffer:

1. ``_experts_bwd``, one program per block: ``delta = rowsum(dO * O)``;
   compressed keys: ``dq += s^2 dS R``, ``dR += s^2 dS^T q`` and
   ``dVt += P^T dO`` (atomics; the probabilities are already in registers,
   so ``dVt`` needs no second pass); routed keys: ``dq += s dS K``,
   ``dk += s dS^T q``, ``dv += P^T dO`` (atomics: a key may be routed by
   several experts, an expert span several blocks). ``dq`` (float32) is
   stored;
2. ``_shared_bwd``, one program per (group, key block): the shared
   expert's backward from its saved log-sum-exp,
   ``dS = P (dVt V^T - rowsum(dVt * Vt))``, ``dR += s dS K`` (atomics),
   ``dk += s dS^T R``, ``dv += P^T dVt``; it owns its keys, so it adds the
   routed sums of step 1 and writes ``dk``, ``dv`` in their dtype;
3. ``_pool_bwd``, one program per (group, token block): ``dq += dR / bin
   size`` for every bin holding the patch query, written in its dtype.

Launches per call (ATen ops that do work + Triton kernels; measured in the
interpreter at N = 1025 and 4097, bf16, 6 heads): 4 forward, 8 forward +
backward (the 4 above, the fill, 3 kernels); under autocast, plus the casts
of q, k, v to the autocast dtype.
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
def _bin_size(offs_l, hgt, wid, ph, pw):
    """Patches in the bin of landmark ``offs_l``."""
    r0, r1, c0, c1 = _bin_bounds(offs_l, hgt, wid, ph, pw)
    return (r1 - r0) * (c1 - c0)


@triton.jit
def _bins(offs_l, offs_p, hgt, wid, ph, pw):
    """[L, P]: whether patch ``offs_p`` (row-major on the ``hgt x wid``
    grid) lies in the bin of landmark ``offs_l``."""
    r0, r1, c0, c1 = _bin_bounds(offs_l, hgt, wid, ph, pw)
    r = (offs_p // wid)[None, :]
    c = (offs_p % wid)[None, :]
    return ((r0[:, None] <= r) & (r < r1[:, None]) & (c0[:, None] <= c)
            & (c < c1[:, None]))


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
def _probs(a, b, lse, pair_mask, scale, PRECISION: tl.constexpr,
           UPCAST: tl.constexpr):
    """Probabilities of the logits ``scale * a b^T`` (``scale`` in base 2),
    recomputed from the log-sum-exp of each row (0 where masked)."""
    logits = _dot(a, tl.trans(b), PRECISION, UPCAST)
    return tl.where(pair_mask, tl.exp2(logits * scale - lse[:, None]), 0.0)


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
def _landmark_rows(g, offs, m, d, offs_d, d_mask):
    """Offsets and mask of rows ``offs`` of group ``g`` in a contiguous
    [G, m, d] tensor (landmarks, shared values and their gradients)."""
    mask = offs < m
    return ((g * m + offs).to(tl.int64)[:, None] * d + offs_d[None, :],
            mask[:, None] & d_mask[None, :], mask)


@triton.jit
def _block_queries(SLOTS, g, blk, slots_per_group, BLOCK: tl.constexpr):
    """Queries of block ``blk`` of group ``g`` (int64, 0 where empty) and
    their mask."""
    offs = g.to(tl.int64) * slots_per_group + blk * BLOCK + tl.arange(0, BLOCK)
    rows = tl.load(SLOTS + offs)
    return tl.where(rows >= 0, rows, 0).to(tl.int64), rows >= 0


@triton.jit
def _block(Q, SLOTS, BLOCK_EXPERT, heads, sqb, sqh, sqn, d, slots_per_group,
           num_blocks, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """The block of this program (grid: group, block): its group, its expert
    (-1 unused), its queries' rows and mask, the head-dim offsets and mask,
    and the queries."""
    g = tl.program_id(0)
    blk = tl.program_id(1)
    expert = tl.load(BLOCK_EXPERT + g * num_blocks + blk)
    rows, row_mask = _block_queries(SLOTS, g, blk, slots_per_group, BLOCK)
    offs_d, d_mask = _head_dim(d, BLOCK_D)
    q = _load_rows(Q + _group_base(g, heads, sqb, sqh), rows, row_mask, sqn,
                   offs_d, d_mask)
    return g, expert, rows, row_mask, offs_d, d_mask, q


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
def _add_key_grads(DK, DV, offs, mask, ds, p, q, do, PRECISION: tl.constexpr,
                   UPCAST: tl.constexpr):
    """Add ``dS^T q`` into ``DK`` and ``P^T dO`` into ``DV`` (float32
    atomics) at ``offs``."""
    tl.atomic_add(
        DK + offs,
        _dot(_cast(tl.trans(ds), q.dtype, UPCAST), q, PRECISION, UPCAST),
        mask=mask)
    tl.atomic_add(
        DV + offs,
        _dot(_cast(tl.trans(p), do.dtype, UPCAST), do, PRECISION, UPCAST),
        mask=mask)


@triton.jit(do_not_specialize=['n', 'hgt', 'wid', 'first'])
def _landmarks_fwd(Q, K, V, R, VT, LSE_R, KEY_LOGITS, n, m, d, heads, first,
                   hgt, wid, ph, pw, sqb, sqh, sqn, skb, skh, skn, svb, svh,
                   svn, qk_scale, BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                   UPCAST: tl.constexpr):
    """Landmarks, key logits and shared values of ``BLOCK_L`` landmarks."""
    g = tl.program_id(0)
    l0 = tl.program_id(1) * BLOCK_L
    offs_l = l0 + tl.arange(0, BLOCK_L)
    offs_d, d_mask = _head_dim(d, BLOCK_D)
    r_offs, r_mask, l_mask = _landmark_rows(g, offs_l, m, d, offs_d, d_mask)
    q_base = Q + _group_base(g, heads, sqb, sqh) + first * sqn
    # Patch rows that this block's bins cover.
    last = tl.minimum(l0 + BLOCK_L, m) - 1
    p_start = (l0 // pw) * hgt // ph * wid
    p_end = (((last // pw) + 1) * hgt + ph - 1) // ph * wid
    pooled = tl.zeros([BLOCK_L, BLOCK_D], tl.float32)
    for p0 in range(p_start, p_end, BLOCK_N):
        offs_p = p0 + tl.arange(0, BLOCK_N)
        p_mask = offs_p < p_end
        member = _bins(offs_l, offs_p, hgt, wid, ph, pw)
        patches = _load_rows(q_base, offs_p.to(tl.int64), p_mask, sqn, offs_d,
                             d_mask)
        pooled += _dot(
            _cast(member.to(tl.float32), patches.dtype, UPCAST), patches,
            PRECISION, UPCAST)
    size = tl.where(l_mask, _bin_size(offs_l, hgt, wid, ph, pw), 1)
    marks = _cast(pooled / size[:, None], R.dtype.element_ty, UPCAST)
    tl.store(R + r_offs, marks, mask=r_mask)

    k_base, v_base = _kv_bases(K, V, g, heads, skb, skh, svb, svh)
    m_i = tl.full([BLOCK_L], -float('inf'), tl.float32)
    l_i = tl.zeros([BLOCK_L], tl.float32)
    acc = tl.zeros([BLOCK_L, BLOCK_D], tl.float32)
    for n0 in range(0, n, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < n
        keys = _load_rows(k_base, offs_n.to(tl.int64), n_mask, skn, offs_d,
                          d_mask)
        values = _load_rows(v_base, offs_n.to(tl.int64), n_mask, svn, offs_d,
                            d_mask)
        logits = _dot(marks, tl.trans(keys), PRECISION, UPCAST)
        tl.store(
            KEY_LOGITS + (g * m + offs_l).to(tl.int64)[:, None] * n +
            offs_n[None, :],
            logits,
            mask=l_mask[:, None] & n_mask[None, :])
        logits = tl.where(n_mask[None, :], logits * qk_scale, -float('inf'))
        m_i, l_i, acc = _online_softmax(m_i, l_i, acc, logits, values,
                                        PRECISION, UPCAST)
    tl.store(
        VT + r_offs,
        _cast(acc / l_i[:, None], VT.dtype.element_ty, UPCAST),
        mask=r_mask)
    tl.store(LSE_R + g * m + offs_l, m_i + tl.log2(l_i), mask=l_mask)


@triton.jit(do_not_specialize=['n', 'slots_per_group', 'num_blocks'])
def _route_and_sort(Q, R, GIVEN, EXPERT, SLOTS, BLOCK_EXPERT, n, m, d, heads,
                    sqb, sqh, sqn, slots_per_group, num_blocks,
                    ROUTE: tl.constexpr, BLOCK: tl.constexpr,
                    CHUNK: tl.constexpr, M_PAD: tl.constexpr,
                    BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                    UPCAST: tl.constexpr):
    """Routing (``ROUTE``: argmax of ``q . R``; else the ids in ``GIVEN``)
    and counting sort of the queries of one group into its blocks of
    ``BLOCK`` slots, ``CHUNK`` queries (slots, blocks) at a time."""
    g = tl.program_id(0)
    offs_d, d_mask = _head_dim(d, BLOCK_D)
    offs_e = tl.arange(0, M_PAD)
    if ROUTE:
        r_offs, r_mask, e_mask = _landmark_rows(g, offs_e, m, d, offs_d,
                                                d_mask)
        marks = tl.load(R + r_offs, mask=r_mask, other=0.0)
    q_base = Q + _group_base(g, heads, sqb, sqh)
    group_slots = SLOTS + g.to(tl.int64) * slots_per_group
    for s0 in range(0, slots_per_group, CHUNK):  # every slot empty first
        offs_s = s0 + tl.arange(0, CHUNK)
        tl.store(
            group_slots + offs_s,
            tl.full([CHUNK], -1, tl.int32),
            mask=offs_s < slots_per_group)
    # Pass 1: the expert of every query, and the queries per expert.
    counts = tl.zeros([M_PAD], tl.int32)
    for i0 in range(0, n, CHUNK):
        offs_i = i0 + tl.arange(0, CHUNK)
        i_mask = offs_i < n
        if ROUTE:
            q = _load_rows(q_base, offs_i.to(tl.int64), i_mask, sqn, offs_d,
                           d_mask)
            scores = _dot(q, tl.trans(marks), PRECISION, UPCAST)
            scores = tl.where(e_mask[None, :], scores, -float('inf'))
            expert = tl.argmax(scores, 1)
        else:
            expert = tl.load(GIVEN + g * n + offs_i, mask=i_mask, other=0)
        tl.store(EXPERT + g * n + offs_i, expert.to(tl.int32), mask=i_mask)
        one_hot = (expert[:, None] == offs_e[None, :]) & i_mask[:, None]
        counts += tl.sum(one_hot.to(tl.int32), 0)
    blocks = (counts + BLOCK - 1) // BLOCK
    blocks_end = tl.cumsum(blocks, 0)
    first_slot = (blocks_end - blocks) * BLOCK
    for b0 in range(0, num_blocks, CHUNK):
        offs_b = b0 + tl.arange(0, CHUNK)
        owner = tl.sum((blocks_end[None, :] <= offs_b[:, None]).to(tl.int32),
                       1)
        tl.store(
            BLOCK_EXPERT + g * num_blocks + offs_b,
            tl.where(owner < m, owner, -1),
            mask=offs_b < num_blocks)
    tl.debug_barrier()  # pass 2 reads EXPERT and overwrites the -1 slots
    # Pass 2: stable rank of each query among its expert's.
    taken = tl.zeros([M_PAD], tl.int32)
    for i0 in range(0, n, CHUNK):
        offs_i = i0 + tl.arange(0, CHUNK)
        i_mask = offs_i < n
        expert = tl.load(EXPERT + g * n + offs_i, mask=i_mask, other=0)
        one_hot = ((expert[:, None] == offs_e[None, :])
                   & i_mask[:, None]).to(tl.int32)
        rank = tl.cumsum(one_hot, 0) - one_hot  # earlier queries
        slot = tl.sum(one_hot * (rank + (first_slot + taken)[None, :]), 1)
        tl.store(group_slots + slot, offs_i, mask=i_mask)
        taken += tl.sum(one_hot, 0)


@triton.jit(do_not_specialize=['n', 'k', 'slots_per_group', 'num_blocks'])
def _experts_fwd(Q, K, V, R, VT, TOPK, SLOTS, BLOCK_EXPERT, OUT, LSE, n, m, k,
                 d, heads, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn,
                 slots_per_group, num_blocks, qk_scale, rl_scale,
                 BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                 UPCAST: tl.constexpr):
    """Output and log-sum-exp (base 2) of the queries of one block."""
    g, expert, rows, row_mask, offs_d, d_mask, q = _block(
        Q, SLOTS, BLOCK_EXPERT, heads, sqb, sqh, sqn, d, slots_per_group,
        num_blocks, BLOCK, BLOCK_D)
    if expert < 0:
        return
    m_i = tl.full([BLOCK], -float('inf'), tl.float32)
    l_i = tl.zeros([BLOCK], tl.float32)
    acc = tl.zeros([BLOCK, BLOCK_D], tl.float32)
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
        _cast(acc / l_i[:, None], OUT.dtype.element_ty, UPCAST),
        mask=o_mask)
    tl.store(LSE + out_rows, m_i + tl.log2(l_i), mask=row_mask)


@triton.jit(do_not_specialize=['n', 'k', 'slots_per_group', 'num_blocks'])
def _experts_bwd(Q, K, V, R, VT, TOPK, SLOTS, BLOCK_EXPERT, OUT, LSE, n, m, k,
                 d, heads, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn,
                 slots_per_group, num_blocks, qk_scale, rl_scale, DO, DQ_ACC,
                 DK_ACC, DV_ACC, DR, DVT, sob, soh, son, scale,
                 BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                 UPCAST: tl.constexpr):
    """Gradients through the expert attention of one block of queries:
    ``dq`` (float32, stored), and ``dR``, ``dVt`` and the routed keys'
    ``dk``, ``dv`` (float32, added atomically)."""
    g, expert, rows, row_mask, offs_d, d_mask, q = _block(
        Q, SLOTS, BLOCK_EXPERT, heads, sqb, sqh, sqn, d, slots_per_group,
        num_blocks, BLOCK, BLOCK_D)
    if expert < 0:
        return
    do = _load_rows(DO + _group_base(g, heads, sob, soh), rows, row_mask, son,
                    offs_d, d_mask)
    out_rows = g.to(tl.int64) * n + rows
    o_offs, o_mask = _row_offsets(out_rows, row_mask, d, offs_d, d_mask)
    out = tl.load(OUT + o_offs, mask=o_mask, other=0.0)
    delta = tl.sum(do.to(tl.float32) * out.to(tl.float32), 1)
    lse = tl.load(LSE + out_rows, mask=row_mask, other=0.0)
    dq = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    for n0 in range(0, m, BLOCK_N):
        marks, values, n_mask, r_offs, r_mask = _compressed_keys(
            R, VT, g, n0, m, d, offs_d, d_mask, BLOCK_N)
        p = _probs(q, marks, lse, row_mask[:, None] & n_mask[None, :],
                   rl_scale, PRECISION, UPCAST)
        ds = _score_grad(p, do, values, delta, PRECISION, UPCAST) * (
            scale * scale)
        dq += _dot(_cast(ds, marks.dtype, UPCAST), marks, PRECISION, UPCAST)
        _add_key_grads(DR, DVT, r_offs, r_mask, ds, p, q, do, PRECISION,
                       UPCAST)
    k_base, v_base = _kv_bases(K, V, g, heads, skb, skh, svb, svh)
    topk_e = TOPK + (g * m + expert).to(tl.int64) * k  # the expert's row
    for n0 in range(0, k, BLOCK_N):
        n_mask, key_rows, keys, values = _routed_keys(
            topk_e, k_base, v_base, n0, k, skn, svn, offs_d, d_mask, BLOCK_N)
        p = _probs(q, keys, lse, row_mask[:, None] & n_mask[None, :], qk_scale,
                   PRECISION, UPCAST)
        ds = _score_grad(p, do, values, delta, PRECISION, UPCAST) * scale
        dq += _dot(_cast(ds, keys.dtype, UPCAST), keys, PRECISION, UPCAST)
        kv_offs, kv_mask = _row_offsets(
            g.to(tl.int64) * n + key_rows, n_mask, d, offs_d, d_mask)
        _add_key_grads(DK_ACC, DV_ACC, kv_offs, kv_mask, ds, p, q, do,
                       PRECISION, UPCAST)
    tl.store(DQ_ACC + o_offs, dq, mask=o_mask)


@triton.jit(do_not_specialize=['n'])
def _shared_bwd(K, V, R, VT, LSE_R, DR, DVT, DK_ACC, DV_ACC, DK, DV, n, m, d,
                heads, skb, skh, skn, svb, svh, svn, qk_scale, scale,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """The shared expert's backward for ``BLOCK_N`` keys: ``dR`` (added
    atomically), and the final ``dk``, ``dv`` of these keys."""
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
    for l0 in range(0, m, BLOCK_N):
        offs_l = l0 + tl.arange(0, BLOCK_N)
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
        tl.atomic_add(
            DR + r_offs,
            _dot(_cast(ds, keys.dtype, UPCAST), keys, PRECISION, UPCAST),
            mask=r_mask)
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
    ``dR / bin size`` of every bin holding it; written in its dtype."""
    g = tl.program_id(0)
    offs_t = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d, d_mask = _head_dim(d, BLOCK_D)
    offs, mask = _row_offsets(
        g.to(tl.int64) * n + offs_t, offs_t < n, d, offs_d, d_mask)
    dq = tl.load(DQ_ACC + offs, mask=mask, other=0.0)
    patch = offs_t - first
    is_patch = (patch >= 0) & (patch < hgt * wid)
    for l0 in range(0, m, BLOCK_N):
        offs_l = l0 + tl.arange(0, BLOCK_N)
        r_offs, r_mask, l_mask = _landmark_rows(g, offs_l, m, d, offs_d,
                                                d_mask)
        member = _bins(offs_l, tl.where(is_patch, patch, 0), hgt, wid, ph, pw)
        member = member & l_mask[:, None] & is_patch[None, :]
        size = _bin_size(offs_l, hgt, wid, ph, pw).to(tl.float32)
        weight = tl.where(member, 1.0 / size[:, None], 0.0)
        grad_marks = tl.load(DR + r_offs, mask=r_mask, other=0.0)
        dq += _dot(tl.trans(weight), grad_marks, 'ieee', False)
    tl.store(DQ + offs, _cast(dq, DQ.dtype.element_ty, UPCAST), mask=mask)


def _next_pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


class _Config:
    """Block sizes and launch settings for one call (from shapes only)."""

    def __init__(self, n: int, m: int, d: int, dtype: torch.dtype,
                 interpreted: bool):
        self.block_d = max(16, _next_pow2(d))
        self.m_pad = max(16, _next_pow2(m))
        self.block_l = 16  # landmarks per program of _landmarks_fwd
        if interpreted:  # small blocks: the interpreter runs them in numpy
            self.block, self.block_n, self.sort_chunk = 16, 16, 32
        else:
            # Blocks no larger than the mean expert (N / m queries). float32
            # (exact IEEE products, no tensor cores: the accurate path, not
            # the fast one) uses 32: 64-wide IEEE dots take 3x the compile
            # time.
            largest = 32 if dtype == torch.float32 else 64
            self.block = min(largest, max(16, _next_pow2(-(-n // m))))
            self.block_n = min(64 if self.block_d <= 64 else 32, largest)
            # _route_and_sort is one program per group: large chunks.
            self.sort_chunk = 256
        self.num_warps = 4 if self.block_d <= 64 else 8
        # float32: exact products (tf32 would lose 3 decimal digits).
        self.precision = 'ieee' if dtype == torch.float32 else 'tf32'
        self.upcast = interpreted and dtype == torch.bfloat16
        self.num_blocks = n // self.block + min(m, n)
        self.slots = self.block * self.num_blocks

    def kwargs(self) -> dict:
        kwargs = dict(
            BLOCK_D=self.block_d, PRECISION=self.precision, UPCAST=self.upcast)
        if not interpreted():
            kwargs['num_warps'] = self.num_warps
        return kwargs


def interpreted() -> bool:
    """Whether the kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1
    was set before triton was first imported (triton's own ``tl.zeros``,
    ``tl.sum``... are decorated when triton is imported)."""
    return all(
        isinstance(fn, InterpretedFunction) for fn in (_experts_fwd, tl.zeros))


def _strides(t: Tensor) -> Tuple[int, int, int]:
    """Batch, head and token strides of a [B, heads, N, d] tensor."""
    return t.stride(0), t.stride(1), t.stride(2)


def route_and_sort(q: Tensor,
                   landmarks: Tensor,
                   cfg: _Config,
                   expert: Optional[Tensor] = None):
    """Launch ``_route_and_sort``: the expert of every query [G, N] (int32;
    routed by ``q . R``, or ``expert`` [G, N] when given), ``slots``
    [G, cfg.slots] (query of each slot, -1 empty) and ``block_expert``
    [G, cfg.num_blocks] (expert of each block, -1 unused), int32."""
    b, heads, n, d = q.shape
    g, m = b * heads, landmarks.shape[1]
    ids = torch.empty(g, n, device=q.device, dtype=torch.int32)
    slots = torch.empty(g, cfg.slots, device=q.device, dtype=torch.int32)
    block_expert = torch.empty(
        g, cfg.num_blocks, device=q.device, dtype=torch.int32)
    _route_and_sort[(g, )](
        q, landmarks, ids if expert is None else expert, ids, slots,
        block_expert, n, m, d, heads, *_strides(q), cfg.slots,
        cfg.num_blocks, ROUTE=expert is None, BLOCK=cfg.block,
        CHUNK=cfg.sort_chunk, M_PAD=cfg.m_pad, **cfg.kwargs())
    return ids, slots, block_expert


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
    cfg = _Config(n, m, d, q.dtype, interpreted())
    scale = d**-0.5
    marks = q.new_empty(g, m, d)
    shared_values = torch.empty_like(marks)
    lse_shared = q.new_empty(g, m, dtype=torch.float32)
    key_logits = q.new_empty(g, m, n, dtype=torch.float32)
    strides = (*_strides(q), *_strides(k), *_strides(v))
    _landmarks_fwd[(g, triton.cdiv(m, cfg.block_l))](
        q, k, v, marks, shared_values, lse_shared, key_logits, n, m, d, heads,
        first, hgt, wid, ph, pw, *strides, scale * LOG2E.value,
        BLOCK_L=cfg.block_l, BLOCK_N=cfg.block_n, **cfg.kwargs())
    if topk_index is None:
        topk_index = key_logits.topk(
            min(topk, n), dim=-1, sorted=False).indices
    else:  # given routing: an output must not alias an input
        topk_index = topk_index.clone(memory_format=torch.contiguous_format)
    ids, slots, block_expert = route_and_sort(q, marks, cfg, expert)
    out = q.new_empty(b, heads, n, d)
    lse = q.new_empty(g, n, dtype=torch.float32)
    _experts_fwd[(g, cfg.num_blocks)](
        *_block_args(q, k, v, marks, shared_values, topk_index, slots,
                     block_expert, out, lse, cfg),
        BLOCK=cfg.block, BLOCK_N=cfg.block_n, **cfg.kwargs())
    return (out, lse, marks, shared_values, lse_shared, topk_index, ids, slots,
            block_expert)


def _forward_fake(q: Tensor, k: Tensor, v: Tensor, sizes: Sizes):
    hgt, wid, first, ph, pw, topk = sizes
    b, heads, n, d = q.shape
    g, m = b * heads, ph * pw
    cfg = _Config(n, m, d, q.dtype, interpreted())
    f32, i32 = torch.float32, torch.int32
    return (q.new_empty(b, heads, n, d), q.new_empty(g, n, dtype=f32),
            q.new_empty(g, m, d), q.new_empty(g, m,
                                              d), q.new_empty(g, m, dtype=f32),
            q.new_empty(g, m, min(topk, n),
                        dtype=torch.int64), q.new_empty(g, n, dtype=i32),
            q.new_empty(g, cfg.slots,
                        dtype=i32), q.new_empty(g, cfg.num_blocks, dtype=i32))


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
    cfg = _Config(n, m, d, q.dtype, interpreted())
    scale = d**-0.5
    # Every float32 sum added into with atomics: one zero-filled buffer.
    sums = q.new_zeros(2 * g * (n + m) * d, dtype=torch.float32)
    dk_sum, dv_sum, d_marks, d_shared = sums.split(
        [g * n * d, g * n * d, g * m * d, g * m * d])
    dq_sum = q.new_empty(g * n * d, dtype=torch.float32)
    dq, dk, dv = (
        torch.empty_like(t, memory_format=torch.contiguous_format)
        for t in (q, k, v))
    kv_strides = (*_strides(k), *_strides(v))
    _experts_bwd[(g, cfg.num_blocks)](
        *_block_args(q, k, v, landmarks, shared_values, topk_index, slots,
                     block_expert, out, lse, cfg),
        grad_out, dq_sum, dk_sum, dv_sum, d_marks, d_shared,
        *_strides(grad_out), scale, BLOCK=cfg.block, BLOCK_N=cfg.block_n,
        **cfg.kwargs())
    _shared_bwd[(g, triton.cdiv(n, cfg.block_n))](
        k, v, landmarks, shared_values, lse_shared, d_marks, d_shared, dk_sum,
        dv_sum, dk, dv, n, m, d, heads, *kv_strides, scale * LOG2E.value,
        scale, BLOCK_N=cfg.block_n, **cfg.kwargs())
    kwargs = cfg.kwargs()
    del kwargs['PRECISION']
    _pool_bwd[(g, triton.cdiv(n, cfg.block_n))](
        dq_sum, d_marks, dq, n, m, d, first, hgt, wid, m // pw, pw,
        BLOCK_N=cfg.block_n, **kwargs)
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
