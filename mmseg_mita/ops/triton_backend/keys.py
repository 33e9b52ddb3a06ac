"""``_keys``, grid (G, S): the keys pass of the forward (see the package
docstring, step 2): per split of the tokens, the shared expert's partial
softmax of ``s R K^T``, the chunk maxima of the fused top-k (or ``R
K^T`` itself), and the routing of the split's queries with their counts
per expert.
"""
import triton
import triton.language as tl

from .helpers import (_dot, _group_base, _head_dim, _kv_bases, _landmark_rows,
                      _load_rows, _online_softmax)
from .topk import _logits, LOWEST_BITS, _order_bits


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
