"""``_merge``, grid (G, max(m, S)): the shared expert's values from the
splits' partial softmaxes, each landmark's top-k (:mod:`.topk`), the
block layout of the experts and the counting sort of the queries into
their slots (see the package docstring, step 3).
"""
import triton
import triton.language as tl

from .helpers import _cast, _head_dim
from .topk import _merged_topk


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
