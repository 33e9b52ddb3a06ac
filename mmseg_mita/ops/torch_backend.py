"""Pure PyTorch MiTA backend: blocked attention over per-expert key sets.

The queries, sorted by expert, are cut into blocks of ``block`` queries that
all belong to one expert (the last block of an expert is padded with zero
queries, whose outputs are dropped). One batched matmul scores every block
against its expert's ``k`` routed keys; the ``m`` compressed logits are the
routing logits ``R . q`` already computed, scaled by ``s^2``. One softmax
covers both, so no merge of partial softmaxes is needed. Memory is linear in
N: no N x N tensor and no per-query copy of keys.
"""
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .routing import gather_routed, sort_by_expert


def block_size(num_tokens: int, num_experts: int) -> int:
    """A power of two near the mean number of queries per expert, in
    [8, 128]: small enough to keep padding low, large enough for efficient
    batched matmuls."""
    mean = max(1.0, num_tokens / num_experts)
    return int(min(128, max(8, 2**round(math.log2(mean)))))


def softmax_fp32(logits: Tensor) -> Tensor:
    """Softmax over the last dim, in float32 at least (fp16/bf16 inputs)."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return torch.softmax(logits, dim=-1)


def _to_blocks(x: Tensor, slot: Tensor, num_slots: int) -> Tensor:
    """Scatter rows of ``x`` [Q, c] to their padded slots [num_slots, c]."""
    return x.new_zeros(num_slots, x.shape[1]).index_copy(0, slot, x)


def mita_torch(q: Tensor, k: Tensor, v: Tensor, experts,
               dropout_p: float = 0.0) -> Tensor:
    b, h, n, d = q.shape
    g = b * h
    m = experts.landmarks.shape[1]
    scale = d**-0.5
    k_sel, v_sel = gather_routed(
        k.reshape(g, n, d), v.reshape(g, n, d), experts.topk_index)

    order, group, counts = sort_by_expert(experts.expert, m)
    blk = block_size(n, m)
    blocks_per_expert = (counts + blk - 1) // blk
    block_expert = torch.repeat_interleave(
        torch.arange(g * m, device=q.device), blocks_per_expert)
    num_slots = block_expert.numel() * blk
    # Slot of each query: its expert's first block * blk + its rank there.
    first_query = torch.cumsum(counts, 0) - counts
    first_slot = (torch.cumsum(blocks_per_expert, 0) - blocks_per_expert) * blk
    sorted_group = group[order]
    rank = torch.arange(g * n, device=q.device) - first_query[sorted_group]
    slot = torch.empty_like(order)
    slot[order] = first_slot[sorted_group] + rank

    q_blocks = _to_blocks(q.reshape(g * n, d), slot, num_slots)
    compressed = experts.route_logits.transpose(1, 2).reshape(g * n, m)
    compressed = _to_blocks(compressed * scale**2, slot, num_slots)
    q_blocks = q_blocks.view(-1, blk, d)
    routed = (q_blocks @ k_sel[block_expert].transpose(1, 2)) * scale
    logits = torch.cat([compressed.view(-1, blk, m), routed], dim=-1)
    probs = softmax_fp32(logits).to(v.dtype)
    if dropout_p > 0:
        probs = F.dropout(probs, p=dropout_p)
    shared = experts.shared_values.to(v.dtype)[block_expert // m]
    out = probs[..., :m] @ shared + probs[..., m:] @ v_sel[block_expert]
    return out.reshape(num_slots, d)[slot].view(b, h, n, d)
