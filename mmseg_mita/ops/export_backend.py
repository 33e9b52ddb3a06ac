"""MiTA for export (ONNX): forward only, standard operators, fixed shapes.

The same attention as the other backends, written so that a tracing
exporter records every step as a standard ONNX operator and no size depends
on the data:

* landmarks: the patch queries times the fixed pooling matrix of
  :mod:`.fixed_pooling` (MatMul; valid for any grid and a dynamic H, W);
* routed keys: ``TopK`` with ``k = min(topk, N)`` computed as a tensor;
  routing: ``ArgMax``; shared expert: ``Softmax`` and ``MatMul``;
* per query, the keys and values of its expert: each expert's ``k`` keys
  and values are gathered once (``[G * m, k, d]``), then one ``Gather`` of
  whole ``k x d`` blocks by the query's expert (``[G * N, k, d]``).

No ``N x N`` tensor: the largest is ``[G * N, k, d]``, linear in ``N``. The
per-query copy replaces the eager backend's sort into per-expert blocks,
whose number of blocks (and so its shapes) depends on the routing.
"""
from typing import Sequence, Tuple, Union

import torch
from torch import Tensor

from .fixed_pooling import grid_pool_matrix

Size = Union[int, Tensor]  # a Python int, or a traced size under export


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
    # Then, per query, its expert's block: [G * N, k, d].
    query_expert = (expert + (group * m)[:, None]).flatten()
    keys = expert_keys[query_expert]
    values = expert_values[query_expert]

    # One softmax over the m compressed and the k routed logits.
    routed = (keys @ q.reshape(-1, d, 1)).view(g, n, -1) * scale
    probs = _softmax(torch.cat([route_logits, routed], dim=-1))
    out = probs[..., :m] @ shared_values  # [G, N, d]
    out = out + (probs[..., m:].reshape(g * n, 1, -1) @ values).view(g, n, d)
    return out.view(b, heads, n, d)
