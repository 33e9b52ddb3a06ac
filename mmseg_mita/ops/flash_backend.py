"""MiTA on flash-attn's public ``flash_attn_varlen_func`` (CUDA, fp16/bf16).

Each global expert is one varlen "sequence": its routed queries attend to
``[s R ; K_routed]`` with values ``[Vt ; V_routed]`` and softmax scale ``s``,
which is exactly one softmax over the ``m`` compressed and ``k`` routed
logits. One call, differentiable through flash-attn's own autograd.

Contract (:mod:`.experts`): ``mita_flash(q, k, v, experts, dropout_p)`` for
fp16/bf16 CUDA tensors with ``head_dim <= 256``, a multiple of 8;
``dropout_p`` goes to flash-attn. Experts that receive no query are left
out of the call (no empty varlen sequence); finding them, and the longest
query sequence, reads two numbers on the host.
"""
import importlib.util
from functools import lru_cache
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .experts import MiTAExperts
from .routing import gather_routed, sort_by_expert


@lru_cache(maxsize=None)
def _flash_attn_installed() -> bool:
    return importlib.util.find_spec('flash_attn') is not None


def flash_attn_available() -> bool:
    """flash-attn is importable and CUDA is present."""
    return torch.cuda.is_available() and _flash_attn_installed()


def expert_key_sets(k: Tensor, v: Tensor,
                    experts: MiTAExperts) -> Tuple[Tensor, Tensor]:
    """Keys ``[s R ; K_routed]`` and values ``[Vt ; V_routed]`` of every
    global expert, [G * m, m + k, d] each (the m shared keys are repeated
    per expert: m * (m + k) rows per group, independent of N)."""
    g, n, d = k.shape
    m = experts.landmarks.shape[1]
    k_sel, v_sel = gather_routed(k, v, experts.topk_index)
    shared_keys = (experts.landmarks * d**-0.5).to(k.dtype)
    keys = torch.cat([shared_keys.repeat_interleave(m, dim=0), k_sel], dim=1)
    values = torch.cat([
        experts.shared_values.to(v.dtype).repeat_interleave(m, dim=0), v_sel
    ], dim=1)
    return keys, values


def mita_flash(q: Tensor, k: Tensor, v: Tensor, experts: MiTAExperts,
               dropout_p: float = 0.0) -> Tensor:
    from flash_attn import flash_attn_varlen_func

    b, h, n, d = q.shape
    g = b * h
    m = experts.landmarks.shape[1]
    keys, values = expert_key_sets(k.reshape(g, n, d), v.reshape(g, n, d),
                                   experts)
    keys_per_expert = keys.shape[1]

    order, _, counts = sort_by_expert(experts.expert, m)
    used = counts.nonzero().squeeze(1)  # experts that receive a query
    counts = counts.index_select(0, used)
    keys, values = keys.index_select(0, used), values.index_select(0, used)
    cu_q = F.pad(torch.cumsum(counts, 0), (1, 0)).to(torch.int32)
    cu_k = torch.arange(
        used.numel() + 1, device=q.device,
        dtype=torch.int32) * keys_per_expert
    q_sorted = q.reshape(g * n, d).index_select(0, order)
    out = flash_attn_varlen_func(
        q_sorted.unsqueeze(1), keys.reshape(-1, 1, d),
        values.reshape(-1, 1, d), cu_q, cu_k, int(counts.max()),
        keys_per_expert, dropout_p=dropout_p, softmax_scale=d**-0.5)
    out = torch.empty_like(q_sorted).index_copy(0, order, out.squeeze(1))
    return out.view(b, h, n, d)
