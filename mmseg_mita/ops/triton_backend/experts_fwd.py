"""``_experts_fwd``, a program per ``BLOCK_M`` slots: each query's ONE
online softmax over the ``m`` compressed logits and its expert's ``k``
routed keys (see the package docstring, step 4).
"""
import triton
import triton.language as tl

from .helpers import (_block, _cast, _compressed_keys, _dot, _kv_bases,
                      _online_softmax, _routed_keys, _row_offsets)


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
