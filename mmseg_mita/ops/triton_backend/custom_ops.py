"""The ``torch.library`` custom ops of the fused pipeline
(``mmseg_mita::mita_triton_fwd`` / ``mmseg_mita::mita_triton_bwd``: the
launches, with fake implementations and autograd), the entry points
:func:`mita_triton` and :func:`mita_triton_routed`, and the backend's
declaration ``BACKEND``.
"""
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ..declaration import HALF_DTYPES, MiTABackend
from ..experts import compute_dtype
from ..plan import MiTAPlan
from . import settings
from .backward import _experts_bwd, _shared_bwd
from .experts_fwd import _experts_fwd
from .helpers import LOG2E
from .keys import _keys
from .merge import _merge
from .pooling import _pool, _pool_bwd
from .settings import _log2


def _strides(name: str, t: Tensor) -> Dict[str, int]:
    """Batch, head and token strides of a [B, heads, N, d] tensor, as the
    kernels' arguments ``s{name}b``, ``s{name}h``, ``s{name}n``."""
    return {f's{name}{axis}': t.stride(i) for i, axis in enumerate('bhn')}


def _block_args(q, k, v, marks, shared_values, topk_index, slots, block_expert,
                out, lse, cfg: settings.Config) -> dict:
    """The arguments that ``_experts_fwd`` and ``_experts_bwd`` share."""
    b, heads, n, d = q.shape
    scale = d**-0.5
    return dict(
        Q=q, K=k, V=v, R=marks, VT=shared_values, TOPK=topk_index,
        SLOTS=slots, BLOCK_EXPERT=block_expert, OUT=out, LSE=lse, n=n,
        m=marks.shape[1], k=topk_index.shape[-1], d=d, heads=heads,
        **_strides('q', q), **_strides('k', k), **_strides('v', v),
        slots_per_group=cfg.slots, num_blocks=cfg.num_blocks,
        qk_scale=scale * LOG2E.value, rl_scale=scale * scale * LOG2E.value,
        BLOCK=cfg.block)


Sizes = Tuple[int, int, int, int, int, int]  # hgt, wid, first, ph, pw, topk


def _forward(q: Tensor, k: Tensor, v: Tensor, sizes: Sizes,
             expert: Optional[Tensor], topk_index: Optional[Tensor]):
    """The four launches of the forward (five with ``torch.topk`` for
    ``k > 64``); ``G = B heads`` groups, ``S`` splits of the keys pass."""
    hgt, wid, first, ph, pw, topk = sizes
    b, heads, n, d = q.shape
    g, m = b * heads, ph * pw
    cfg = settings.call_config(q, m, topk)
    f32, i32, i64 = torch.float32, torch.int32, torch.int64
    exact = dict(PRECISION=cfg.precision, UPCAST=cfg.upcast)
    marks = q.new_empty(g, m, d)  # [G, m, d]: R
    _pool[cfg.grid('pool')](
        Q=q, R=marks, m=m, d=d, heads=heads, first=first, hgt=hgt, wid=wid,
        ph=ph, pw=pw, **_strides('q', q), BLOCK_P=cfg.block_p,
        BLOCK_D=cfg.block_d, UPCAST=cfg.upcast, **cfg.launch('pool'))
    fused = cfg.fused_topk and topk_index is None
    store_logits = not cfg.fused_topk and topk_index is None
    ids = q.new_empty(g, n, dtype=i32)  # [G, N]: each query's expert
    counts = q.new_empty(g, cfg.splits, cfg.m_pad, dtype=i32)  # [G, S, M_PAD]
    part_o = q.new_empty(g, m, cfg.splits, d, dtype=f32)  # [G, m, S, d]
    part_lse = q.new_empty(g, m, cfg.splits, dtype=f32)  # [G, m, S]
    chunk_max = q.new_empty(  # [G, m, chunks]: order-preserving bits
        (g, m, cfg.chunks) if fused else (0, ), dtype=i32)
    group_max = q.new_empty(  # [G, m, chunk groups]
        (g, m, cfg.chunk_groups) if fused and cfg.log_g else (0, ),
        dtype=i32)
    key_logits = q.new_empty(  # [G, m, N]: R K^T, for torch.topk
        (g, m, n) if store_logits else (0, ), dtype=f32)
    _keys[cfg.grid('keys')](
        Q=q, K=k, V=v, R=marks, GIVEN=ids if expert is None else expert,
        EXPERT=ids, COUNTS=counts, PART_O=part_o, PART_LSE=part_lse,
        CHUNK_MAX=chunk_max, GROUP_MAX=group_max, KEY_LOGITS=key_logits,
        n=n, m=m, d=d, heads=heads, chunk=cfg.chunk, **_strides('q', q),
        **_strides('k', k), **_strides('v', v),
        qk_scale=d**-0.5 * LOG2E.value, ROUTE=expert is None,
        FUSED_TOPK=fused, STORE_LOGITS=store_logits,
        LOG_L=_log2(cfg.keys_l), LOG_N=_log2(cfg.keys_n), LOG_C=cfg.log_c,
        LOG_G=cfg.log_g, BLOCK_Q=cfg.block_q, E_TILE=cfg.e_tile,
        M_PAD=cfg.m_pad, BLOCK_D=cfg.block_d, **exact,
        **cfg.launch('keys'))
    if topk_index is not None:  # given: an output must not alias an input
        topk_index = topk_index.clone(memory_format=torch.contiguous_format)
    elif store_logits:
        topk_index = key_logits.topk(cfg.k, dim=-1, sorted=False).indices
    else:
        topk_index = q.new_empty(g, m, cfg.k, dtype=i64)  # [G, m, k]
    shared_values = torch.empty_like(marks)  # [G, m, d]: Vt
    lse_shared = q.new_empty(g, m, dtype=f32)  # [G, m]
    slots = q.new_empty(g, cfg.slots, dtype=i32)  # [G, slots]: slot -> query
    block_expert = q.new_empty(g, cfg.num_blocks, dtype=i32)  # [G, blocks]
    _merge[cfg.grid('merge')](
        PART_O=part_o, PART_LSE=part_lse, CHUNK_MAX=chunk_max,
        GROUP_MAX=group_max, COUNTS=counts, EXPERT=ids, K=k, R=marks,
        VT=shared_values, LSE_R=lse_shared, TOPK=topk_index, SLOTS=slots,
        BLOCK_EXPERT=block_expert, n=n, m=m, k=cfg.k, d=d, heads=heads,
        **_strides('k', k), chunk=cfg.chunk, splits=cfg.splits,
        slots_per_group=cfg.slots, num_blocks=cfg.num_blocks,
        FUSED_TOPK=fused, BLOCK=cfg.block, LOG_S=_log2(cfg.block_s),
        BLOCK_I=cfg.block_i, ROWS=cfg.sort_rows, LOG_E=_log2(cfg.e_tile),
        M_PAD=cfg.m_pad, LOG_K=_log2(cfg.k_pad), LOG_C=cfg.log_c,
        LOG_G=cfg.log_g, LOG_REST=cfg.log_rest, LOG_L=_log2(cfg.keys_l),
        BLOCK_D=cfg.block_d, **exact, **cfg.launch('merge'))
    out = q.new_empty(b, heads, n, d)  # [B, heads, N, d]
    lse = q.new_empty(g, n, dtype=f32)  # [G, N]
    _experts_fwd[cfg.grid('experts_fwd')](
        **_block_args(q, k, v, marks, shared_values, topk_index, slots,
                      block_expert, out, lse, cfg),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=cfg.block_d,
        **exact, **cfg.launch('experts_fwd'))
    return (out, lse, marks, shared_values, lse_shared, topk_index, ids, slots,
            block_expert)


def _forward_fake(q: Tensor, k: Tensor, v: Tensor, sizes: Sizes):
    hgt, wid, first, ph, pw, topk = sizes
    b, heads, n, d = q.shape
    g, m = b * heads, ph * pw
    cfg = settings.call_config(q, m, topk)
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
    """The backward: one zero fill and three launches."""
    hgt, wid, first, pw = sizes
    b, heads, n, d = q.shape
    g, m = landmarks.shape[:2]
    if grad_out.stride(-1) != 1:  # e.g. expanded by the backward of a sum
        grad_out = grad_out.contiguous()
    cfg = settings.call_config(q, m, topk_index.shape[-1])
    exact = dict(PRECISION=cfg.precision, UPCAST=cfg.upcast)
    scale = d**-0.5
    # Every float32 sum added into with atomics: one zero-filled buffer.
    sums = q.new_zeros(2 * g * (n + m) * d, dtype=torch.float32)
    # [G, N, d] twice (the routed dk, dv), [G, m, d] twice (dR, dVt)
    dk_sum, dv_sum, d_marks, d_shared = sums.split(
        [g * n * d, g * n * d, g * m * d, g * m * d])
    dq_sum = q.new_empty(g * n * d, dtype=torch.float32)  # [G, N, d]
    dq, dk, dv = (  # [B, heads, N, d]
        torch.empty_like(t, memory_format=torch.contiguous_format)
        for t in (q, k, v))
    _experts_bwd[cfg.grid('experts_bwd')](
        **_block_args(q, k, v, landmarks, shared_values, topk_index, slots,
                      block_expert, out, lse, cfg),
        DO=grad_out, DQ_ACC=dq_sum, DK_ACC=dk_sum, DV_ACC=dv_sum, DR=d_marks,
        DVT=d_shared, **_strides('o', grad_out), scale=scale,
        BLOCK_M=cfg.block_m_bwd, BLOCK_N=cfg.block_n_bwd, M_PAD=cfg.m_pad,
        BLOCK_D=cfg.block_d, SUM_LANDMARKS=cfg.sum_landmarks, **exact,
        **cfg.launch('experts_bwd'))
    _shared_bwd[cfg.grid('shared_bwd')](
        K=k, V=v, R=landmarks, VT=shared_values, LSE_R=lse_shared, DR=d_marks,
        DVT=d_shared, DK_ACC=dk_sum, DV_ACC=dv_sum, DK=dk, DV=dv, n=n, m=m,
        d=d, heads=heads, **_strides('k', k), **_strides('v', v),
        qk_scale=scale * LOG2E.value, scale=scale, BLOCK_N=cfg.shared_n,
        BLOCK_L=cfg.block_l, BLOCK_D=cfg.block_d, **exact,
        **cfg.launch('shared_bwd'))
    _pool_bwd[cfg.grid('pool_bwd')](
        DQ_ACC=dq_sum, DR=d_marks, DQ=dq, n=n, m=m, d=d, first=first,
        hgt=hgt, wid=wid, ph=m // pw, pw=pw, BLOCK_N=cfg.pool_n,
        BLOCK_D=cfg.block_d, UPCAST=cfg.upcast, **cfg.launch('pool_bwd'))
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
    if q.device.type == 'cpu' and not settings.interpreted():
        return ['runs on CPU tensors only in Triton\'s interpreter: set '
                'TRITON_INTERPRET=1 before triton is first imported (slow, '
                'for tests)']
    return []


BACKEND = MiTABackend('triton', mita_triton,
                      dtypes=(torch.float32, ) + HALF_DTYPES,
                      max_head_dim=128, max_experts_per_query=1,
                      ablations=False, dropout=False, requires=('triton', ),
                      checks=_interpreter_reasons)
