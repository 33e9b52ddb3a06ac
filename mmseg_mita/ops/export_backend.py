"""MiTA for export (ONNX): forward only, standard operators, fixed shapes.

The same attention as the other backends, written so that a tracing
exporter records every step as a standard ONNX operator and no shape
depends on the data:

* the shared part is :func:`~.experts.compute_experts`, as for the torch
  and flash backends (either landmark convention), with the landmarks as
  the pooled queries times the fixed pooling matrix of
  :mod:`.fixed_pooling` (``MatMul``; valid for any grid and a dynamic H,
  W): routed keys and routing by ``TopK`` (``k =
  min(topk, N)`` a traced size, which follows the input's N), shared
  expert by ``Softmax`` and ``MatMul``;
* each expert's ``k`` keys and values gathered once
  (:func:`~.routing.gather_routed`, ``Gather``);
* the routed attention in the per-expert blocks of every backend
  (:func:`~.routing.block_layout`, ``BLOCK`` fixed: N is traced): expert
  ``e`` with ``c_e`` queries needs ``ceil(c_e / BLOCK)`` blocks, at most
  ``N // BLOCK + min(m, N)`` in all, so every group gets that many (the
  unused ones hold zero queries). A query's slot is its expert's first
  block times ``BLOCK`` plus its rank among the expert's queries (a
  ``CumSum`` over a one-hot ``[G, N, m]``, the one step that differs from
  the torch backend's stable sort, which ONNX lacks); queries and their
  compressed logits are scattered to their slots (``ScatterElements``),
  each block's expert keys and values taken (``Gather``), scored by one
  batched ``MatMul``, one ``Softmax`` over the ``m`` compressed and ``k``
  routed logits (:func:`~.experts.softmax_fp32`), and the outputs gathered
  back (``GatherElements``).

No ``N x N`` tensor: everything is linear in ``N`` (slots: at most
``N + min(m, N) * BLOCK`` per group). Per-query copies of the expert's keys
(``[G * N, k, d]``) would also be linear, but ONNX Runtime ran this layout
about 1.5x faster at N = 1025 (docs/deploy.md).

What it does not compute (gradients, dropout, several experts per query,
the ablations) is declared in ``BACKEND``, at the end.
"""
from typing import Sequence, Tuple

import torch
from torch import Tensor

from .declaration import MiTABackend
from .experts import compute_experts, softmax_fp32
from .fixed_pooling import grid_pool_matrix
from .plan import MiTAPlan
from .routing import Size, block_layout, gather_routed

BLOCK = 16  # query slots per block (8, 16 and 32 ran alike in ONNX Runtime)


def _fixed_landmarks(tokens: Tensor, hw: Sequence[Size],
                     pool_size: Tuple[int, int]) -> Tensor:
    """:func:`~.experts.pool_landmarks` as one product with the fixed
    pooling matrix (valid for any grid and a traced H, W)."""
    return grid_pool_matrix(hw, pool_size, tokens.dtype,
                            tokens.device) @ tokens


def mita_export(q: Tensor, k: Tensor, v: Tensor, plan: MiTAPlan) -> Tensor:
    """The export backend's run: MiTA of ``q``, ``k``, ``v`` [B, heads, N,
    d] for the call's ``plan`` (forward only; its sizes may be traced)."""
    b, heads = q.shape[:2]
    n, d, m = plan.num_tokens, plan.head_dim, plan.num_landmarks
    experts = compute_experts(q, k, v, plan, pool=_fixed_landmarks)
    q, k, v = (t.reshape(-1, n, d) for t in (q, k, v))  # [G, N, d]
    g = q.shape[0]
    # Each expert's k keys and values, once: [G * m, k, d].
    expert_keys, expert_values = gather_routed(k, v, experts.topk_index)

    # Per-expert blocks (the one-hot ranks: ONNX has no stable sort).
    layout = block_layout(experts.expert[..., 0], m, BLOCK, num_tokens=n,
                          onehot=True)
    num_slots = g * layout.slots_per_group
    rows = layout.slot[:, None]  # [G * N, 1]
    q_slots = q.new_zeros(num_slots, d).scatter(0, rows.expand(-1, d),
                                                q.reshape(-1, d))
    compressed = experts.route_logits.new_zeros(num_slots, m).scatter(
        0, rows.expand(-1, m), experts.route_logits.reshape(-1, m))
    keys = expert_keys[layout.block_expert]  # [G * blocks, k, d]
    values = expert_values[layout.block_expert]

    # One softmax over the m compressed and the k routed logits.
    routed = (q_slots.view(-1, BLOCK, d) @ keys.transpose(1, 2)) * plan.scale
    probs = softmax_fp32(
        torch.cat([compressed.view(-1, BLOCK, m), routed],
                  dim=-1)).to(q.dtype)
    out = probs[..., :m].reshape(g, -1, m) @ experts.shared_values
    out = out.view(-1, d) + (probs[..., m:] @ values).view(-1, d)
    return out.gather(0, rows.expand(-1, d)).view(b, heads, n, d)


BACKEND = MiTABackend('export', mita_export, max_experts_per_query=1,
                      ablations=False, dropout=False, backward=False)
