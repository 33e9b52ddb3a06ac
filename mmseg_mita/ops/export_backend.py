"""MiTA for export (ONNX): forward only, standard operators, fixed shapes.

The same attention as the other backends, written so that a tracing
exporter records every step as a standard ONNX operator and no shape
depends on the data:

* landmarks: the patch queries times the fixed pooling matrix of
  :mod:`.fixed_pooling` (MatMul; valid for any grid and a dynamic H, W);
* routed keys: ``TopK`` with ``k = min(topk, N)`` computed as a tensor;
  routing: ``ArgMax``; shared expert: ``Softmax`` and ``MatMul``;
* the routed attention in the per-expert blocks of every backend
  (:func:`~.routing.block_layout`, ``BLOCK`` fixed: N is traced): expert
  ``e`` with ``c_e`` queries needs ``ceil(c_e / BLOCK)`` blocks, at most
  ``N // BLOCK + min(m, N)`` in all, so every group gets that many (the
  unused ones hold zero queries). A query's slot is its expert's first
  block times ``BLOCK`` plus its rank among the expert's queries (a
  ``CumSum`` over a one-hot ``[G, N, m]``, the one step that differs from
  the torch backend's stable sort, which ONNX lacks); queries and their
  compressed logits are scattered to their slots (``ScatterElements``),
  each block's ``k`` keys and values gathered once (``Gather``), scored by
  one batched ``MatMul``, and the outputs gathered back
  (``GatherElements``).

No ``N x N`` tensor: everything is linear in ``N`` (slots: at most
``N + min(m, N) * BLOCK`` per group). Per-query copies of the expert's keys
(``[G * N, k, d]``) would also be linear, but ONNX Runtime ran this layout
about 1.5x faster at N = 1025 (docs/deploy.md).
"""
from typing import Sequence, Tuple

import torch
from torch import Tensor

from .fixed_pooling import grid_pool_matrix
from .routing import Size, block_layout

BLOCK = 16  # query slots per block (8, 16 and 32 ran alike in ONNX Runtime)


def _topk_count(topk: int, num_tokens: Size) -> Size:
    """``min(topk, N)``; a tensor when N is a traced size, so that the
    exported TopK follows the input's N."""
    if isinstance(num_tokens, Tensor):
        return torch.clamp(num_tokens, max=topk)
    return min(topk, num_tokens)


def _softmax(logits: Tensor) -> Tensor:
    """Softmax over the last dim, in float32 at least, back in the input's
    dtype."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        return torch.softmax(logits.float(), dim=-1).to(logits.dtype)
    return torch.softmax(logits, dim=-1)


def mita_export(q: Tensor, k: Tensor, v: Tensor, hw: Sequence[Size],
                num_extra_tokens: int, pool_size: Tuple[int, int],
                topk: int) -> Tensor:
    """MiTA attention of ``q``, ``k``, ``v`` [B, heads, N, d] (forward only).

    Arguments as :func:`~.mita_attention.mita_attention`, already checked;
    ``hw`` may hold traced sizes. Returns [B, heads, N, d].
    """
    b, heads, n, d = q.shape
    d = int(d)  # the head width: a constant of the model, also when traced
    q, k, v = (t.reshape(-1, n, d) for t in (q, k, v))  # [G, N, d]
    g = q.shape[0]
    m = pool_size[0] * pool_size[1]
    scale = d**-0.5

    pool = grid_pool_matrix(hw, pool_size, q.dtype, q.device)  # [m, H*W]
    landmarks = pool @ q[:, num_extra_tokens:]  # [G, m, d]
    key_logits = landmarks @ k.transpose(1, 2)  # [G, m, N]
    topk_index = key_logits.topk(_topk_count(topk, n), dim=-1).indices
    shared_values = _softmax(key_logits * scale) @ v  # [G, m, d]
    route_logits = q @ (landmarks * d**-1).transpose(1, 2)  # [G, N, m]
    expert = route_logits.argmax(dim=-1)  # [G, N]

    # Each expert's k keys and values, once: rows of [G * N, d].
    group = torch.arange(g, device=q.device)
    key_rows = (topk_index + (group * n)[:, None, None]).flatten()
    expert_keys = k.reshape(-1, d)[key_rows].view(g * m, -1, d)
    expert_values = v.reshape(-1, d)[key_rows].view(g * m, -1, d)

    # Per-expert blocks (the one-hot ranks: ONNX has no stable sort).
    layout = block_layout(expert, m, BLOCK, num_tokens=n, onehot=True)
    num_slots = g * layout.slots_per_group
    rows = layout.slot[:, None]  # [G * N, 1]
    q_slots = q.new_zeros(num_slots, d).scatter(0, rows.expand(-1, d),
                                                q.reshape(-1, d))
    compressed = route_logits.new_zeros(num_slots, m).scatter(
        0, rows.expand(-1, m), route_logits.reshape(-1, m))
    keys = expert_keys[layout.block_expert]  # [G * blocks, k, d]
    values = expert_values[layout.block_expert]

    # One softmax over the m compressed and the k routed logits.
    routed = (q_slots.view(-1, BLOCK, d) @ keys.transpose(1, 2)) * scale
    probs = _softmax(
        torch.cat([compressed.view(-1, BLOCK, m), routed], dim=-1))
    out = probs[..., :m].reshape(g, -1, m) @ shared_values
    out = out.view(-1, d) + (probs[..., m:] @ values).view(-1, d)
    return out.gather(0, rows.expand(-1, d)).view(b, heads, n, d)
