"""Index bookkeeping shared by the MiTA backends.

Queries of all ``G = B * heads`` groups are grouped by their global expert
``g * m + e``; each expert owns its ``topk`` routed keys and values,
gathered once per expert (never per query).

:func:`block_layout` is THE grouping of the torch, export and flash
backends: queries in blocks of ``block`` slots, one expert per block, with
a number of slots that follows from the shapes alone (no host read, no
data-dependent shape), so that it runs eagerly, under
``torch.compile(fullgraph=True)`` and under ONNX export tracing with a
traced N. The fused Triton backend builds the same layout on the device,
in its routing kernel (a counting sort).
"""
from typing import NamedTuple, Tuple, Union

import torch
from torch import Tensor

Size = Union[int, Tensor]  # a Python int, or a traced size under export


class BlockLayout(NamedTuple):
    """Queries laid out in blocks of ``block`` slots, one expert per block.

    Every group gets ``slots_per_group = block * blocks_per_group(N, m,
    block)`` slots (:func:`blocks_per_group`, from the shapes only); group
    ``g`` owns slots ``[g * S, (g + 1) * S)`` and, inside them, its
    experts' blocks one after the other in expert order: expert ``e``
    (``c_e`` queries) gets ``ceil(c_e / block)`` blocks starting at block
    ``sum_{e' < e} ceil(c_e' / block)``, and its queries take its first
    ``c_e`` slots in their order in the sequence. Unused slots (the tail of
    an expert's last block, the blocks after a group's last expert) hold no
    query; experts without a query get no block.

    ``slot``: slot (into ``G * S``) of each flat query [G * N];
    ``block_expert``: global expert of each block [G * S / block] (an
    unused block after a group's last expert belongs to that group's expert
    ``m - 1``);
    ``block``, ``slots_per_group``: the sizes above (Python ints, or under
    export tracing ``slots_per_group`` a traced size).
    """
    slot: Tensor
    block_expert: Tensor
    block: int
    slots_per_group: Size


def global_experts(expert: Tensor, num_experts: int) -> Tensor:
    """The global expert ``g * m + e`` of each query of ``expert`` [G, N],
    flat [G * N]."""
    offset = torch.arange(expert.shape[0], device=expert.device)[:, None]
    return (expert + offset * num_experts).flatten()


def _sort_and_count(group: Tensor,
                    num_groups: int) -> Tuple[Tensor, Tensor]:
    """Stable order of ``group`` [Q] (ids < ``num_groups``) and the count
    of every id."""
    order = torch.argsort(group, stable=True)
    # Not bincount: on CUDA it reads the largest id on the host (a sync).
    counts = group.new_zeros(num_groups).index_add_(0, group,
                                                    torch.ones_like(group))
    return order, counts


def blocks_per_group(num_tokens: Size, num_experts: int, block: int) -> Size:
    """``N // block + min(m, N)``: an upper bound on ``sum_e ceil(c_e /
    block)`` over the experts of a group of ``N`` queries (each non-empty
    expert adds at most one block beyond ``c_e / block``, and at most
    ``min(m, N)`` experts are non-empty). A traced size for a traced N."""
    if isinstance(num_tokens, Tensor):
        return num_tokens // block + torch.clamp(num_tokens, max=num_experts)
    return num_tokens // block + min(num_experts, num_tokens)


def block_size(num_tokens: int, num_experts: int,
               candidates: Tuple[int, ...] = (8, 16, 32, 64),
               per_block_cost: float = 24.0) -> int:
    """The block size of least estimated cost for ``N`` queries over ``m``
    experts, from these sizes alone (never from the routing).

    Cost = the slots of :func:`blocks_per_group` blocks (each costs one
    query's attention, used or not) plus ``per_block_cost`` slot-equivalents
    per block (gathering the expert's keys and values, and the lower
    efficiency of small matmuls): about ``N + 24 N / block + m block``,
    least near ``block = sqrt(24 N / m)``.
    """
    def cost(size):
        return (blocks_per_group(num_tokens, num_experts, size) *
                (size + per_block_cost))

    return min(candidates, key=cost)


def _ranks_by_sort(group: Tensor, num_groups: int,
                   num_experts: int) -> Tuple[Tensor, Tensor]:
    """Rank of each flat query among its global expert's queries (``group``
    [G * N] from :func:`global_experts`), and the query count of every
    expert [G, m], by one stable sort."""
    order, counts = _sort_and_count(group, num_groups * num_experts)
    first_query = torch.cumsum(counts, 0) - counts
    sorted_rank = (torch.arange(group.numel(), device=group.device) -
                   first_query.index_select(0, group.index_select(0, order)))
    rank = torch.empty_like(order).index_copy_(0, order, sorted_rank)
    return rank, counts.view(num_groups, num_experts)


def _ranks_by_onehot(expert: Tensor,
                     num_experts: int) -> Tuple[Tensor, Tensor]:
    """As :func:`_ranks_by_sort`, by a cumulative sum over a one-hot
    ``[G, N, m]`` (standard ONNX operators: ONNX has no stable sort, its
    ``TopK`` leaves the order of ties open)."""
    experts = torch.arange(num_experts, device=expert.device)
    onehot = (expert[..., None] == experts).long()  # [G, N, m]
    rank = (onehot.cumsum(1) * onehot).sum(-1) - 1
    return rank.flatten(), onehot.sum(1)


def block_layout(expert: Tensor, num_experts: int, block: int = 0, *,
                 num_tokens: Size = None,
                 onehot: bool = False) -> BlockLayout:
    """Place the queries of ``expert`` [G, N] in per-expert blocks
    (:class:`BlockLayout`).

    ``block=0`` picks :func:`block_size` of the shapes. ``num_tokens``: N
    as a traced size under export (default ``expert.shape[1]``).
    ``onehot`` ranks the queries within their expert by a one-hot
    cumulative sum instead of a stable sort (the one op that differs for
    ONNX export: see :func:`_ranks_by_onehot`; it takes ``G N m`` memory,
    the sort ``G N``). No host read either way: every size comes from the
    shapes, so the layout traces into one graph under
    ``torch.compile(fullgraph=True)``.
    """
    g, n = expert.shape
    if num_tokens is None:
        num_tokens = n
    block = block or block_size(n, num_experts)
    per_group = blocks_per_group(num_tokens, num_experts, block)
    device = expert.device
    group = global_experts(expert, num_experts)
    if onehot:
        rank, counts = _ranks_by_onehot(expert, num_experts)
    else:
        rank, counts = _ranks_by_sort(group, g, num_experts)

    blocks = torch.div(counts + block - 1, block, rounding_mode='floor')
    ends = blocks.cumsum(1)  # [G, m]: end block of each expert in its group
    # Slot: (group's first block + its expert's first block) * block + rank.
    first_block = ends - blocks + torch.arange(g, device=device)[:, None] \
        * per_group
    slot = first_block.flatten().index_select(0, group) * block + rank

    # Expert of each block: the number of experts that end at or before
    # it (unused trailing blocks: expert m - 1, which they do not serve).
    block_ids = torch.arange(per_group, device=device)
    local = (ends[:, None, :] <= block_ids[:, None]).sum(-1)
    local = local.clamp(max=num_experts - 1)
    block_expert = global_experts(local, num_experts)
    return BlockLayout(slot, block_expert, block, per_group * block)


def to_slots(x: Tensor, slot: Tensor, num_slots: int) -> Tensor:
    """Rows of ``x`` [Q, c] placed at their slots (``BlockLayout.slot``)
    of a zero [num_slots, c] (differentiable)."""
    return x.new_zeros(num_slots, x.shape[1]).index_copy_(0, slot, x)


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
