"""Index bookkeeping shared by the MiTA backends.

Queries of all ``G = B * heads`` groups are sorted by their global expert
``g * m + e`` so that each expert's queries are contiguous; each expert owns
its ``topk`` routed keys and values, gathered once per expert (never per
query).
"""
from typing import NamedTuple, Tuple

import torch
from torch import Tensor


class ExpertOrder(NamedTuple):
    """``order``: flat query indices (into G * N) sorted by global expert;
    ``group``: global expert of each flat query [G * N];
    ``counts``: queries per global expert [G * m]."""
    order: Tensor
    group: Tensor
    counts: Tensor


def sort_by_expert(expert: Tensor, num_experts: int) -> ExpertOrder:
    """Sort the queries of ``expert`` [G, N] by global expert id."""
    g = expert.shape[0]
    offset = torch.arange(g, device=expert.device)[:, None] * num_experts
    group = (expert + offset).flatten()
    order = torch.argsort(group, stable=True)
    counts = torch.bincount(group, minlength=g * num_experts)
    return ExpertOrder(order, group, counts)


def gather_routed(k: Tensor, v: Tensor,
                  topk_index: Tensor) -> Tuple[Tensor, Tensor]:
    """Keys and values of every routed expert.

    Args:
        k, v: [G, N, d]; topk_index: [G, m, k].
    Returns:
        Two tensors [G * m, k, d].
    """
    g, n, d = k.shape
    offset = torch.arange(g, device=k.device)[:, None, None] * n
    flat = (topk_index + offset).flatten()
    shape = (g * topk_index.shape[1], topk_index.shape[2], d)
    return (k.reshape(g * n, d)[flat].view(shape),
            v.reshape(g * n, d)[flat].view(shape))
