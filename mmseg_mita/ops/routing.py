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


class BlockLayout(NamedTuple):
    """Queries laid out in blocks of ``block`` slots, one expert per block.

    Every group gets the same number of slots ``slots_per_group`` (a multiple
    of ``block``); group ``g`` owns slots ``[g * S, (g + 1) * S)`` and, inside
    them, its experts' blocks one after the other. Unused slots (the tail of
    an expert's last block, the blocks after a group's last expert) hold no
    query.

    ``slot``: slot (into ``G * S``) of each flat query [G * N];
    ``block_expert``: global expert of each block [G * S / block];
    ``block``, ``slots_per_group``: the sizes above.
    """
    slot: Tensor
    block_expert: Tensor
    block: int
    slots_per_group: int


def sort_by_expert(expert: Tensor, num_experts: int) -> ExpertOrder:
    """Sort the queries of ``expert`` [G, N] by global expert id."""
    g = expert.shape[0]
    offset = torch.arange(g, device=expert.device)[:, None] * num_experts
    group = (expert + offset).flatten()
    order = torch.argsort(group, stable=True)
    # Not bincount: on CUDA it reads the largest id on the host (a sync).
    counts = group.new_zeros(g * num_experts).index_add_(
        0, group, torch.ones_like(group))
    return ExpertOrder(order, group, counts)


def choose_block(counts: Tensor,
                 candidates: Tuple[int, ...] = (8, 16, 32, 64),
                 per_block_cost: float = 24.0) -> int:
    """The block size of least estimated cost for these expert sizes.

    Cost = padded slots (each costs one query's attention) plus
    ``per_block_cost`` slot-equivalents per block (gathering the expert's
    keys and values, and the lower efficiency of small matmuls).
    """
    sizes = torch.tensor(candidates, device=counts.device)[:, None]
    blocks = ((counts + sizes - 1) // sizes).sum(1)
    cost = blocks * (sizes[:, 0] + per_block_cost)
    return candidates[int(cost.argmin())]


def block_layout(expert: Tensor, num_experts: int,
                 block: int = 0) -> BlockLayout:
    """Place the queries of ``expert`` [G, N] in per-expert blocks.

    ``block=0`` picks the block size with :func:`choose_block`.
    """
    g, n = expert.shape
    device = expert.device
    order, group, counts = sort_by_expert(expert, num_experts)
    block = block or choose_block(counts)
    blocks = (counts + block - 1) // block  # per global expert
    ends = torch.cumsum(blocks.view(g, num_experts), dim=1)  # [G, m]
    blocks_per_group = int(ends[:, -1].max())
    slots_per_group = blocks_per_group * block

    # Slot of a query: its group's first slot + its expert's first block
    # in the group * block + its rank among the expert's queries.
    first_block = (ends - blocks.view(g, num_experts)).flatten()
    first_query = torch.cumsum(counts, 0) - counts
    sorted_group = group[order]
    rank = torch.arange(g * n, device=device) - first_query[sorted_group]
    sorted_slot = ((sorted_group // num_experts) * slots_per_group +
                   first_block[sorted_group] * block + rank)
    slot = torch.empty_like(order).index_copy_(0, order, sorted_slot)

    # Expert of each block; the unused blocks after a group's last expert
    # are given to that last expert (they hold no query).
    block_ids = torch.arange(blocks_per_group, device=device).expand(g, -1)
    local = torch.searchsorted(ends, block_ids.contiguous(), right=True)
    local = local.clamp_(max=num_experts - 1)
    offset = torch.arange(g, device=device)[:, None] * num_experts
    block_expert = (local + offset).flatten()
    return BlockLayout(slot, block_expert, block, slots_per_group)


def routed_index(topk_index: Tensor, num_tokens: int) -> Tensor:
    """Flat row (into ``G * N``) of every routed key, [G * m, k]."""
    g, m, k = topk_index.shape
    offset = torch.arange(g, device=topk_index.device)[:, None, None]
    return (topk_index + offset * num_tokens).view(g * m, k)


def gather_routed(k: Tensor, v: Tensor,
                  topk_index: Tensor) -> Tuple[Tensor, Tensor]:
    """Keys and values of every routed expert.

    Args:
        k, v: [G, N, d]; topk_index: [G, m, k].
    Returns:
        Two tensors [G * m, k, d].
    """
    g, n, d = k.shape
    rows = routed_index(topk_index, n).flatten()
    shape = (g * topk_index.shape[1], topk_index.shape[2], d)
    return (k.reshape(g * n, d).index_select(0, rows).view(shape),
            v.reshape(g * n, d).index_select(0, rows).view(shape))
