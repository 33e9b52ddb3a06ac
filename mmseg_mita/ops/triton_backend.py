"""MiTA on fused Triton kernels (CUDA; CPU through ``TRITON_INTERPRET=1``).

Queries are sorted by global expert (:func:`~.routing.sort_by_expert`) and
cut into tiles of at most ``BLOCK_M`` queries that never straddle two
experts; experts without a query get no tile (:func:`expert_tiles`). The
grid is sized by an upper bound on the number of tiles known from the shapes
alone (:func:`max_tiles`), so no count is read on the host; the surplus
programs find an empty tile and return at once.

Forward, one program per tile: the ``m`` compressed logits are read from
``route_logits`` (``s^2 q . R = s q . sR``) with the shared values ``Vt``,
then the expert's ``k`` routed keys and values are read BY INDEX straight
from K and V (``topk_index`` rows, no gathered copy), ``BLOCK_N`` keys at a
time; ONE online softmax in float32 covers all ``m + k`` logits. The program
writes the output and the log-sum-exp (base 2) of every query.

Backward (flash-style: probabilities recomputed from the saved
log-sum-exp, ``delta = rowsum(dO * O)``):

* one program per tile writes ``dq`` (routed keys) and the gradient of the
  compressed logits, ``d route_logits``;
* one program per (chunk of ``CHUNK_M`` queries of one expert, tile of
  ``BLOCK_N`` keys) sums ``dk``/``dv`` of the expert's routed keys (or
  ``dVt`` of the compressed keys) over its queries, then adds the sums into
  float32 buffers with atomics (a key may be routed by several experts, and
  an expert's queries may span several chunks). The result is therefore not
  bitwise deterministic on CUDA (as ``index_add_`` is not).

Autograd carries ``d route_logits`` and ``dVt`` back to q, k and v through
the routing and the shared expert (:func:`~.mita_attention.compute_experts`).

Dropout is not implemented: ``dropout_p > 0`` raises ``ValueError`` (use
``backend='torch'``). float64 is not supported by ``tl.dot``: also a
``ValueError``. Host synchronisations: none in this module; the caller's
routing/top-k (PyTorch) has none either.
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

from .experts import MiTAExperts, compute_dtype
from .routing import routed_index, sort_by_expert

try:  # the kernels below are interpreted when TRITON_INTERPRET=1 was set
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:  # pragma: no cover - very old triton
    InterpretedFunction = ()

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 128
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
def _tile(TILES, num_tiles, pid):
    """Global expert, first and end position (in the sorted order)."""
    expert = tl.load(TILES + pid).to(tl.int64)
    start = tl.load(TILES + num_tiles + pid)
    end = tl.load(TILES + 2 * num_tiles + pid)
    return expert, start, end


@triton.jit
def _rows(ROWS, offs, mask, d, offs_d, d_mask):
    """Flat query rows of sorted positions ``offs``, and their 2-D mask."""
    rows = tl.load(ROWS + offs, mask=mask, other=0).to(tl.int64)
    return rows, rows[:, None] * d + offs_d[None, :], (mask[:, None]
                                                       & d_mask[None, :])


@triton.jit
def _head_dim(d, BLOCK_D: tl.constexpr):
    """Offsets along the head dimension and their mask."""
    offs_d = tl.arange(0, BLOCK_D)
    return offs_d, offs_d < d


@triton.jit
def _tile_queries(TILES, num_tiles, ROWS, d, BLOCK_M: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    """The tile of this program: its global expert, whether it is empty,
    the head-dim offsets and mask, and its queries' row mask, flat rows and
    the offsets and mask of their [BLOCK_M, BLOCK_D] block."""
    expert, start, end = _tile(TILES, num_tiles, tl.program_id(0))
    offs_d, d_mask = _head_dim(d, BLOCK_D)
    offs_m = start + tl.arange(0, BLOCK_M)
    row_mask = offs_m < end
    rows, q_offs, q_mask = _rows(ROWS, offs_m, row_mask, d, offs_d, d_mask)
    return (expert, start >= end, offs_d, d_mask, row_mask, rows, q_offs,
            q_mask)


@triton.jit
def _compressed_logits(RL, rows, row_mask, offs_n, n_mask, m):
    """Base-2 logits of the compressed keys ``offs_n`` (read from
    ``route_logits``), their offsets there and their pair mask."""
    rl_offs = rows[:, None] * m + offs_n[None, :]
    rl_mask = row_mask[:, None] & n_mask[None, :]
    logits = tl.load(RL + rl_offs, mask=rl_mask,
                     other=0.0).to(tl.float32) * LOG2E
    return logits, rl_offs, rl_mask


@triton.jit
def _compressed_values(VT, group, offs_n, n_mask, m, d, offs_d, d_mask):
    """Shared values ``Vt`` of the compressed keys ``offs_n``."""
    return tl.load(VT + (group * m + offs_n)[:, None] * d + offs_d[None, :],
                   mask=n_mask[:, None] & d_mask[None, :],
                   other=0.0)


@triton.jit
def _routed_keys(K, V, KEY_ROWS, expert, offs_n, n_mask, k, d, offs_d,
                 d_mask):
    """The expert's routed keys ``offs_n``, read by index from K and V: the
    keys, the values, and their offsets and mask in K and V."""
    key_rows = tl.load(KEY_ROWS + expert * k + offs_n, mask=n_mask,
                       other=0).to(tl.int64)
    kv_offs = key_rows[:, None] * d + offs_d[None, :]
    kv_mask = n_mask[:, None] & d_mask[None, :]
    keys = tl.load(K + kv_offs, mask=kv_mask, other=0.0)
    values = tl.load(V + kv_offs, mask=kv_mask, other=0.0)
    return keys, values, kv_offs, kv_mask


@triton.jit
def _online_softmax(m_i, l_i, acc, logits, values, PRECISION: tl.constexpr,
                    UPCAST: tl.constexpr):
    """Fold one block of base-2 logits (-inf where masked) and their values
    into the running max ``m_i``, sum ``l_i`` and output ``acc``."""
    m_new = tl.maximum(m_i, tl.max(logits, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(logits - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p.to(values.dtype), values, PRECISION,
                                      UPCAST)
    return m_new, l_i, acc


@triton.jit
def _routed_probs(q, keys, lse, pair_mask, qk_scale, PRECISION: tl.constexpr,
                  UPCAST: tl.constexpr):
    """Probabilities of the routed keys, recomputed from the log-sum-exp
    (0 where masked)."""
    logits = _dot(q, tl.trans(keys), PRECISION, UPCAST)
    return tl.where(pair_mask, tl.exp2(logits * qk_scale - lse[:, None]), 0.0)


@triton.jit
def _score_grad(p, do, values, delta, PRECISION: tl.constexpr,
                UPCAST: tl.constexpr):
    """Softmax backward: ``dS = P * (dO V^T - delta)``."""
    dp = _dot(do, tl.trans(values), PRECISION, UPCAST)
    return p * (dp - delta[:, None])


@triton.jit(do_not_specialize=['num_tiles', 'm', 'k'])  # no recompiles
def _mita_fwd(Q, K, V, RL, VT, KEY_ROWS, ROWS, TILES, OUT, LSE, num_tiles, m,
              k, d, qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
              UPCAST: tl.constexpr):
    """Output and log-sum-exp (base 2) of one tile of queries."""
    (expert, empty, offs_d, d_mask, row_mask, rows, q_offs,
     q_mask) = _tile_queries(TILES, num_tiles, ROWS, d, BLOCK_M, BLOCK_D)
    if empty:
        return
    q = tl.load(Q + q_offs, mask=q_mask, other=0.0)

    m_i = tl.full([BLOCK_M], -float('inf'), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # Compressed keys sR: logits given by route_logits, values Vt.
    for n0 in range(0, m, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < m
        logits, _, _ = _compressed_logits(RL, rows, row_mask, offs_n, n_mask,
                                          m)
        logits = tl.where(n_mask[None, :], logits, -float('inf'))
        values = _compressed_values(VT, expert // m, offs_n, n_mask, m, d,
                                    offs_d, d_mask)
        m_i, l_i, acc = _online_softmax(m_i, l_i, acc, logits, values,
                                        PRECISION, UPCAST)
    # Routed keys of this expert, read by index from K and V.
    for n0 in range(0, k, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < k
        keys, values, _, _ = _routed_keys(K, V, KEY_ROWS, expert, offs_n,
                                          n_mask, k, d, offs_d, d_mask)
        logits = _dot(q, tl.trans(keys), PRECISION, UPCAST)
        logits = tl.where(n_mask[None, :], logits * qk_scale, -float('inf'))
        m_i, l_i, acc = _online_softmax(m_i, l_i, acc, logits, values,
                                        PRECISION, UPCAST)
    out = acc / l_i[:, None]
    tl.store(OUT + q_offs, out.to(OUT.dtype.element_ty), mask=q_mask)
    tl.store(LSE + rows, m_i + tl.log2(l_i), mask=row_mask)


@triton.jit(do_not_specialize=['num_tiles', 'm', 'k'])  # no recompiles
def _mita_bwd_dq(Q, K, V, RL, VT, KEY_ROWS, ROWS, TILES, DO, LSE, DELTA, DQ,
                 DRL, num_tiles, m, k, d, qk_scale, scale,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                 UPCAST: tl.constexpr):
    """``dq`` (routed keys) and ``d route_logits`` of one tile.

    Probabilities are recomputed from the saved log-sum-exp;
    ``dS = P * (dO V^T - delta)`` gives ``d route_logits`` for the compressed
    keys (their logits are ``route_logits``) and ``dq = scale * dS K`` for
    the routed ones.
    """
    (expert, empty, offs_d, d_mask, row_mask, rows, q_offs,
     q_mask) = _tile_queries(TILES, num_tiles, ROWS, d, BLOCK_M, BLOCK_D)
    if empty:
        return
    q = tl.load(Q + q_offs, mask=q_mask, other=0.0)
    do = tl.load(DO + q_offs, mask=q_mask, other=0.0)
    lse = tl.load(LSE + rows, mask=row_mask, other=0.0)
    delta = tl.load(DELTA + rows, mask=row_mask, other=0.0)

    for n0 in range(0, m, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < m
        logits, rl_offs, rl_mask = _compressed_logits(RL, rows, row_mask,
                                                      offs_n, n_mask, m)
        p = tl.where(rl_mask, tl.exp2(logits - lse[:, None]), 0.0)
        values = _compressed_values(VT, expert // m, offs_n, n_mask, m, d,
                                    offs_d, d_mask)
        ds = _score_grad(p, do, values, delta, PRECISION, UPCAST)
        tl.store(DRL + rl_offs, ds.to(DRL.dtype.element_ty), mask=rl_mask)

    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(0, k, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < k
        keys, values, _, _ = _routed_keys(K, V, KEY_ROWS, expert, offs_n,
                                          n_mask, k, d, offs_d, d_mask)
        p = _routed_probs(q, keys, lse, row_mask[:, None] & n_mask[None, :],
                          qk_scale, PRECISION, UPCAST)
        ds = _score_grad(p, do, values, delta, PRECISION, UPCAST)
        dq += _dot(ds.to(keys.dtype), keys, PRECISION, UPCAST)
    tl.store(DQ + q_offs, (dq * scale).to(DQ.dtype.element_ty), mask=q_mask)


@triton.jit(do_not_specialize=['num_chunks', 'm', 'k'])  # no recompiles
def _mita_bwd_dkv(Q, K, V, RL, KEY_ROWS, ROWS, CHUNKS, DO, LSE, DELTA, DK_ACC,
                  DV_ACC, num_chunks, m, k, d, qk_scale, scale,
                  COMPRESSED: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                  PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Gradients of ``BLOCK_N`` keys of one expert, summed over one chunk
    of its queries and added (atomically) into float32 buffers.

    ``COMPRESSED``: the keys are the compressed ones; only ``dVt`` is
    accumulated (into ``DV_ACC`` [G * m, d]; their logits' gradient goes
    through ``route_logits``). Otherwise ``dk``/``dv`` of the routed keys
    (into ``DK_ACC``/``DV_ACC`` [G * N, d]).
    """
    expert, start, end = _tile(CHUNKS, num_chunks, tl.program_id(0))
    if start >= end:
        return
    offs_d, d_mask = _head_dim(d, BLOCK_D)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    if COMPRESSED:
        n_mask = offs_n < m
        kv_offs = ((expert // m) * m + offs_n)[:, None] * d + offs_d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
    else:
        n_mask = offs_n < k
        keys, values, kv_offs, kv_mask = _routed_keys(
            K, V, KEY_ROWS, expert, offs_n, n_mask, k, d, offs_d, d_mask)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for m0 in range(start, end, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        row_mask = offs_m < end
        rows, q_offs, q_mask = _rows(ROWS, offs_m, row_mask, d, offs_d, d_mask)
        do = tl.load(DO + q_offs, mask=q_mask, other=0.0)
        lse = tl.load(LSE + rows, mask=row_mask, other=0.0)
        if COMPRESSED:
            logits, _, pair_mask = _compressed_logits(RL, rows, row_mask,
                                                      offs_n, n_mask, m)
            p = tl.where(pair_mask, tl.exp2(logits - lse[:, None]), 0.0)
            dv += _dot(tl.trans(p.to(do.dtype)), do, PRECISION, UPCAST)
        else:
            q = tl.load(Q + q_offs, mask=q_mask, other=0.0)
            delta = tl.load(DELTA + rows, mask=row_mask, other=0.0)
            p = _routed_probs(q, keys, lse,
                              row_mask[:, None] & n_mask[None, :], qk_scale,
                              PRECISION, UPCAST)
            dv += _dot(tl.trans(p.to(do.dtype)), do, PRECISION, UPCAST)
            ds = _score_grad(p, do, values, delta, PRECISION, UPCAST)
            dk += _dot(tl.trans(ds.to(q.dtype)), q, PRECISION, UPCAST)
    tl.atomic_add(DV_ACC + kv_offs, dv, mask=kv_mask)
    if not COMPRESSED:
        tl.atomic_add(DK_ACC + kv_offs, dk * scale, mask=kv_mask)


def max_tiles(num_queries: int, num_experts: int, block: int) -> int:
    """An upper bound on the tiles of :func:`expert_tiles`, from sizes only.

    ``E`` non-empty experts holding ``c_e >= 1`` queries need
    ``sum ceil(c_e / block) <= sum (c_e - 1) / block + 1 <= Q / block + E``
    tiles, and ``E <= min(num_experts, Q)``.
    """
    return num_queries // block + min(num_experts, num_queries)


def expert_tiles(counts: Tensor, block: int, num_tiles: int) -> Tensor:
    """Tiles of at most ``block`` consecutive queries of one expert.

    ``counts`` [E]: queries per global expert, in the sorted order of
    :func:`~.routing.sort_by_expert`. Returns int32 [3, num_tiles]: the
    global expert, first and end position (into the sorted queries) of every
    tile; experts with no query get no tile, and the tiles past the last
    one (``num_tiles`` is an upper bound, :func:`max_tiles`) are empty
    (first == end == 0). Computed on the device, without a host sync.
    """
    tiles_per_expert = (counts + block - 1) // block
    tiles_end = torch.cumsum(tiles_per_expert, 0)
    tile = torch.arange(num_tiles, device=counts.device)
    expert = torch.searchsorted(tiles_end, tile, right=True)
    valid = expert < counts.numel()
    expert = expert.clamp_(max=counts.numel() - 1)
    queries_end = torch.cumsum(counts, 0)
    first_query = queries_end - counts
    local = tile - (tiles_end - tiles_per_expert)[expert]
    start = first_query[expert] + local * block
    end = torch.minimum(start + block, queries_end[expert])
    start = torch.where(valid, start, 0)
    end = torch.where(valid, end, 0)
    return torch.stack([expert, start, end]).to(torch.int32).contiguous()


def _next_pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


class _Config:
    """Block sizes and launch settings for one call (from shapes only)."""

    def __init__(self, n: int, m: int, d: int, dtype: torch.dtype,
                 interpreted: bool):
        self.block_d = max(16, _next_pow2(d))
        if interpreted:  # small blocks: the interpreter runs them in numpy
            self.block_m, self.block_n, self.chunk_m = 16, 16, 32
        else:
            # Tiles no larger than the mean expert (N / m queries). float32
            # (exact IEEE products, no tensor cores: the accurate path, not
            # the fast one) uses 32: 64-wide IEEE dots take 3x the compile
            # time.
            largest = 32 if dtype == torch.float32 else 64
            self.block_m = min(largest, max(16, _next_pow2(-(-n // m))))
            self.block_n = 64 if self.block_d <= 64 else 32
            self.block_n = min(self.block_n, largest)
            self.chunk_m = 256
        self.num_warps = 4 if self.block_d <= 64 else 8
        # float32: exact products (tf32 would lose 3 decimal digits).
        self.precision = 'ieee' if dtype == torch.float32 else 'tf32'
        self.upcast = interpreted and dtype == torch.bfloat16


def _kernel_kwargs(cfg: _Config) -> dict:
    kwargs = dict(BLOCK_N=cfg.block_n, BLOCK_D=cfg.block_d,
                  PRECISION=cfg.precision, UPCAST=cfg.upcast)
    if not interpreted():
        kwargs['num_warps'] = cfg.num_warps
    return kwargs


def interpreted() -> bool:
    """Whether the kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1
    was set before triton was first imported (triton's own ``tl.zeros``,
    ``tl.sum``... are decorated when triton is imported)."""
    return all(
        isinstance(fn, InterpretedFunction) for fn in (_mita_fwd, tl.zeros))


class TritonMiTA(torch.autograd.Function):
    """MiTA attention given the routing, on the Triton kernels.

    Inputs: ``q``, ``k``, ``v`` [G * N, d] (one dtype, contiguous);
    ``route_logits`` [G * N, m]; ``shared_values`` [G, m, d];
    ``key_rows`` [G * m, k] (rows of the routed keys in ``k``);
    ``rows`` [G * N] (query rows sorted by global expert); ``tiles`` and
    ``chunks`` from :func:`expert_tiles`; ``cfg`` a :class:`_Config`.
    Output [G * N, d].
    """

    @staticmethod
    def forward(ctx, q, k, v, route_logits, shared_values, key_rows, rows,
                tiles, chunks, cfg):
        d = q.shape[1]
        m, topk = shared_values.shape[1], key_rows.shape[1]
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[0], device=q.device, dtype=torch.float32)
        num_tiles = tiles.shape[1]
        _mita_fwd[(num_tiles, )](
            q, k, v, route_logits, shared_values, key_rows, rows, tiles, out,
            lse, num_tiles, m, topk, d, d**-0.5 * LOG2E.value,
            BLOCK_M=cfg.block_m, **_kernel_kwargs(cfg))
        ctx.save_for_backward(q, k, v, route_logits, shared_values, key_rows,
                              rows, tiles, chunks, out, lse)
        ctx.cfg = cfg
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (q, k, v, route_logits, shared_values, key_rows, rows, tiles, chunks,
         out, lse) = ctx.saved_tensors
        cfg = ctx.cfg
        d = q.shape[1]
        m, topk = shared_values.shape[1], key_rows.shape[1]
        scale = d**-0.5
        sizes = (m, topk, d, scale * LOG2E.value, scale)
        kwargs = dict(BLOCK_M=cfg.block_m, **_kernel_kwargs(cfg))
        grad_out = grad_out.contiguous()
        delta = (grad_out.float() * out.float()).sum(-1)

        grad_q = torch.empty_like(q)
        grad_route = torch.empty_like(route_logits)
        num_tiles = tiles.shape[1]
        _mita_bwd_dq[(num_tiles, )](
            q, k, v, route_logits, shared_values, key_rows, rows, tiles,
            grad_out, lse, delta, grad_q, grad_route, num_tiles, *sizes,
            **kwargs)

        # float32 sums, added into by atomics.
        grad_k = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        grad_v = torch.zeros_like(grad_k)
        grad_shared = torch.zeros(shared_values.shape, device=q.device,
                                  dtype=torch.float32)
        num_chunks = chunks.shape[1]
        for compressed, num_keys, dv in ((False, topk, grad_v),
                                         (True, m, grad_shared)):
            grid = (num_chunks, triton.cdiv(num_keys, cfg.block_n))
            _mita_bwd_dkv[grid](
                q, k, v, route_logits, key_rows, rows, chunks, grad_out, lse,
                delta, grad_k, dv, num_chunks, *sizes,
                COMPRESSED=compressed, **kwargs)
        return (grad_q, grad_k.to(k.dtype), grad_v.to(v.dtype), grad_route,
                grad_shared.to(shared_values.dtype), None, None, None, None,
                None)


def check_triton_inputs(q: Tensor, dropout_p: float) -> None:
    """ValueError naming the parameter and the fix for what the kernels
    cannot run."""
    if dropout_p > 0:
        raise ValueError(
            f"backend='triton' does not implement dropout (dropout_p="
            f"{dropout_p}): use backend='torch' for attention dropout, or "
            'dropout_p=0')
    if q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(
            f"backend='triton' supports head_dim <= {MAX_HEAD_DIM}, got "
            f"{q.shape[-1]}: use backend='torch'")
    if q.device.type == 'cpu' and not interpreted():
        raise ValueError(
            "backend='triton' got CPU tensors: Triton kernels run on CUDA; "
            'set TRITON_INTERPRET=1 before triton is first imported to run '
            "them on CPU (slow, for tests), or use backend='torch'")


def mita_triton(q: Tensor, k: Tensor, v: Tensor, experts: MiTAExperts,
                dropout_p: float = 0.0) -> Tensor:
    """The backend entry point (contract in :mod:`.experts`): the default
    variant only (one routed expert per query, shared and routed experts);
    dropout is not implemented. Anything else raises ``ValueError``."""
    check_triton_inputs(q, dropout_p)
    if experts.experts_per_query != 1 or experts.shared_values is None:
        raise ValueError(
            "backend='triton' computes the default variant only "
            '(experts_per_query=1, shared_expert=True, routed_experts=True); '
            "use backend='torch' for the others")
    b, h, n, d = q.shape
    g = b * h
    m = experts.landmarks.shape[1]
    device = q.device.type
    dtype = compute_dtype(q, v)  # softmax and accumulation in float32
    if dtype not in DTYPES:
        raise ValueError(
            f"backend='triton' computes in float32, float16 or bfloat16, got "
            f"{dtype}: cast the inputs, or use backend='torch'")
    cfg = _Config(n, m, d, dtype, interpreted())
    order, _, counts = sort_by_expert(experts.expert[..., 0], m)
    tiles = expert_tiles(counts, cfg.block_m,
                         max_tiles(g * n, g * m, cfg.block_m))
    chunks = expert_tiles(counts, cfg.chunk_m,
                          max_tiles(g * n, g * m, cfg.chunk_m))
    key_rows = routed_index(experts.topk_index, n)
    q, k, v = (t.reshape(g * n, d).to(dtype).contiguous() for t in (q, k, v))
    route_logits = experts.route_logits.reshape(g * n, m).contiguous()
    shared_values = experts.shared_values.to(dtype).contiguous()
    with torch.autocast(device, enabled=False):
        out = TritonMiTA.apply(q, k, v, route_logits, shared_values,
                               key_rows.contiguous(), order, tiles, chunks,
                               cfg)
    return out.view(b, h, n, d)
