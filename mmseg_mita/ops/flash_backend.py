"""MiTA on flash-attn's public ``flash_attn_varlen_func`` (CUDA, fp16/bf16).

Each global expert's routed queries attend to ``[s R ; K_routed]`` with
values ``[Vt ; V_routed]`` and softmax scale ``s``, which is exactly one
softmax over the ``m`` compressed and ``k`` routed logits. One call,
differentiable through flash-attn's own autograd. Routing-only leaves
``s R`` / ``Vt`` out of the key sets; compression-only is one sequence per
group over ``[s R]`` / ``[Vt]``. Several experts per query would need a
key set per distinct expert tuple (up to ``N`` of them): not done here
(``BACKEND``, at the end, declares ``experts_per_query <= 1``; use the
torch backend).

The backend is :func:`mita_flash`: the shared part
(:func:`~.experts.compute_experts`), then :func:`attend_experts` (the seam
of :mod:`.experts`) for fp16/bf16 CUDA tensors with ``head_dim <= 256``, a
multiple of 8 (declared in ``BACKEND``); ``dropout_p`` goes to flash-attn,
which is imported when a call runs. The queries are grouped by expert as
in the torch backend (:func:`~.routing.block_layout`, blocks of ``BLOCK``
slots): each block is one varlen sequence of ``BLOCK`` queries (zeros in
the unused slots) over its expert's key set, so that no sequence is empty,
``max_seqlen_q`` is ``BLOCK`` and nothing is read back to the host. The
price: the unused blocks of the fixed capacity (up to ``min(m, N)`` per
group) are computed too, and each block gets its own copy of its expert's
key set.
"""
from typing import Tuple

import torch
from torch import Tensor

from .declaration import HALF_DTYPES, MiTABackend
from .experts import MiTAExperts, compute_experts
from .plan import MiTAPlan
from .routing import block_layout, gather_routed, to_slots


# Query slots per block: the query tile of flash-attn's forward kernel
# (128 rows for head_dim <= 128), which a shorter sequence would still fill.
BLOCK = 128


def _shared_keys(experts: MiTAExperts, dtype: torch.dtype) -> Tensor:
    """The shared expert's keys ``s R`` [G, m, d]."""
    return (experts.landmarks * experts.landmarks.shape[-1]**-0.5).to(dtype)


def expert_key_sets(k: Tensor, v: Tensor,
                    experts: MiTAExperts) -> Tuple[Tensor, Tensor]:
    """Keys ``[s R ; K_routed]`` and values ``[Vt ; V_routed]`` of every
    global expert, [G * m, m + k, d] each (the m shared keys are repeated
    per expert: m * (m + k) rows per group, independent of N); without a
    shared expert ``K_routed`` and ``V_routed`` alone, [G * m, k, d]."""
    k_sel, v_sel = gather_routed(k, v, experts.topk_index)
    if experts.shared_values is None:
        return k_sel, v_sel
    m = experts.landmarks.shape[1]
    keys = torch.cat(
        [_shared_keys(experts, k.dtype).repeat_interleave(m, dim=0), k_sel],
        dim=1)
    values = torch.cat([
        experts.shared_values.to(v.dtype).repeat_interleave(m, dim=0), v_sel
    ], dim=1)
    return keys, values


def _compression_only(q: Tensor, experts: MiTAExperts,
                      dropout_p: float) -> Tensor:
    """Every group's queries attend to ``[s R]`` / ``[Vt]``: one varlen
    sequence per group."""
    from flash_attn import flash_attn_varlen_func

    b, h, n, d = q.shape
    g, m = b * h, experts.landmarks.shape[1]
    offsets = torch.arange(g + 1, device=q.device, dtype=torch.int32)
    out = flash_attn_varlen_func(
        q.reshape(g * n, 1, d),
        _shared_keys(experts, q.dtype).reshape(g * m, 1, d),
        experts.shared_values.to(q.dtype).reshape(g * m, 1, d), offsets * n,
        offsets * m, n, m, dropout_p=dropout_p, softmax_scale=d**-0.5)
    return out.view(b, h, n, d)


def attend_experts(q: Tensor, k: Tensor, v: Tensor, experts: MiTAExperts,
                   dropout_p: float = 0.0) -> Tensor:
    """MiTA of ``q``, ``k``, ``v`` [B, heads, N, d] given the shared part
    ``experts`` (the seam of :mod:`.experts`), in one
    ``flash_attn_varlen_func`` call: every block of an expert's queries
    (:func:`~.routing.block_layout`) is one varlen sequence over the
    expert's key set (:func:`expert_key_sets`); compression-only is one
    sequence per group. One routed expert per query (declared in
    ``BACKEND``); ``dropout_p`` goes to flash-attn."""
    if experts.expert is None:
        return _compression_only(q, experts, dropout_p)
    from flash_attn import flash_attn_varlen_func

    b, h, n, d = q.shape
    g = b * h
    m = experts.landmarks.shape[1]
    keys, values = expert_key_sets(k.reshape(g, n, d), v.reshape(g, n, d),
                                   experts)
    keys_per_expert = keys.shape[1]

    # One varlen sequence per block of the layout: BLOCK query slots (zero
    # queries in the unused ones, their outputs dropped) over the key set of
    # the block's expert. Every sequence is BLOCK long (none empty, and
    # max_seqlen_q is exact) and the number of blocks follows from the
    # shapes: no host read.
    layout = block_layout(experts.expert[..., 0], m, BLOCK)
    num_blocks = layout.block_expert.numel()
    keys = keys.index_select(0, layout.block_expert)
    values = values.index_select(0, layout.block_expert)
    starts = torch.arange(num_blocks + 1, device=q.device, dtype=torch.int32)
    q_slots = to_slots(q.reshape(g * n, d), layout.slot, num_blocks * BLOCK)
    out = flash_attn_varlen_func(
        q_slots.unsqueeze(1), keys.reshape(-1, 1, d),
        values.reshape(-1, 1, d), starts * BLOCK, starts * keys_per_expert,
        BLOCK, keys_per_expert, dropout_p=dropout_p, softmax_scale=d**-0.5)
    return out.squeeze(1).index_select(0, layout.slot).view(b, h, n, d)


def mita_flash(q: Tensor, k: Tensor, v: Tensor, plan: MiTAPlan) -> Tensor:
    """The flash backend's run: MiTA of ``q``, ``k``, ``v`` [B, heads, N,
    d] for the call's ``plan``."""
    return attend_experts(q, k, v, compute_experts(q, k, v, plan),
                          plan.dropout_p)


BACKEND = MiTABackend('flash', mita_flash, devices=('cuda', ),
                      dtypes=HALF_DTYPES, max_head_dim=256,
                      head_dim_multiple=8, max_experts_per_query=1,
                      requires=('flash_attn', ))
