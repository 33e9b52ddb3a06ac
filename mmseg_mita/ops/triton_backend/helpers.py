"""The jit helpers the passes share: products in the call's precision,
casts, row loads and offsets, the online softmax, and the pieces of the
experts' math both directions use (the compressed keys rebuilt from
``R``, the probabilities from a saved log-sum-exp, the block of a tile,
the routed keys of an expert).

Plain reference: :func:`mmseg_mita.ops.naive.naive_mita`.
"""
import triton
import triton.language as tl



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
