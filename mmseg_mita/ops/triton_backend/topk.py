"""The exact top-k of the fused pipeline (see the package docstring):
order-preserving int32 bits of a float32 logit, int64 keys (bits above
``2^32 - 1 - token``: ties to the lower token), bitonic folds of ``K_PAD``
keys into a sorted list, and :func:`_merged_topk`, the merge's selection
from the keys pass's chunk maxima. :func:`_logits` is the one ``R K^T``
product the keys pass and the merge's recompute share (bit for bit).

Plain reference: ``torch.topk`` over the stored logits (the tests).
"""
import triton
import triton.language as tl

from .helpers import _dot, _group_base, _head_dim, _load_rows


# Below every key of _ranked: the empty places of a top-k list.
LOWEST = tl.constexpr(-2**63)
# Below the bits of every float32 (_order_bits): a token past the end.
LOWEST_BITS = tl.constexpr(-2**31)


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
    """``R K^T`` of landmarks ``marks`` [L, BLOCK_D] (L a multiple of 16)
    and ``keys`` [*, BLOCK_D]: the one product of the keys pass and of the
    merge, which recomputes the logits of its candidates bit for bit. A
    batch of 16-row products whatever L: the same tensor-core instruction
    (mma.sync m16n8k16) in the keys pass's tiles of up to 64 landmarks on
    4 warps (where a 64-row product would be a wgmma) and in the merge's
    one warp."""
    L: tl.constexpr = marks.shape[0]
    if L == 16:
        return _dot(marks, tl.trans(keys), PRECISION, UPCAST)
    T: tl.constexpr = L // 16
    a = tl.reshape(marks, [T, 16, marks.shape[1]])
    b = tl.broadcast_to(
        tl.trans(keys)[None, :, :], [T, keys.shape[1], keys.shape[0]])
    return tl.reshape(_dot(a, b, PRECISION, UPCAST), [L, keys.shape[0]])


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
