"""The backward's experts and shared expert: ``_experts_bwd`` (grid (G,
P), the experts' tiles shared out) and ``_shared_bwd`` (a program per
(group, key block)); see the package docstring. ``_pool_bwd``, the last
launch, is in :mod:`.pooling`.
"""
import triton
import triton.language as tl

from .helpers import (_add, _block, _cast, _compressed_keys, _dot, _group_base,
                      _head_dim, _kv_bases, _landmark_rows, _load_rows, _probs,
                      _routed_keys, _row_offsets, _score_grad)


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
