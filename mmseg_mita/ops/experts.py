"""The shared part of MiTA, and the seam to the attention that reuses it.

:func:`compute_experts` computes, once per call, everything that does not
depend on which experts a query reads: the landmarks, the top-k key
selection, the shared expert and the routing. The torch, flash and export
backends run it, then compute each query's one softmax over its compressed
and routed logits; the Triton backend fuses all of it.

The seam: the torch and flash backends compute that softmax in
``attend_experts(q, k, v, experts, dropout_p) -> out`` (the tests call it
with the routing held fixed) with

* ``q``, ``k``, ``v``: ``[B, heads, N, d]``, one dtype; ``out`` the same;
* ``experts``: a :class:`MiTAExperts` computed from these ``q``, ``k``,
  ``v``; its ``route_logits`` and ``shared_values`` carry the autograd graph
  back to ``q`` (through the landmarks) and to ``k``, ``v`` (through the
  shared expert): the function differentiates its output with respect to
  them, and to ``q``, ``k``, ``v`` directly (routed logits and values); the
  index tensors have no gradient;
* ``dropout_p``: dropout on the attention probabilities (0 in evaluation).

For query ``i`` of group ``g`` with experts ``e_1, ..., e_s =
expert[g, i]`` (best first), it returns ``softmax(l) @ w`` where

* ``l = [route_logits[g, i] ; s q_i . K_g[T_1]^T ; ... ; s q_i .
  K_g[T_s]^T]`` and ``w = [Vt_g ; V_g[T_1] ; ... ; V_g[T_s]]`` with
  ``T_j = topk_index[g, e_j]`` (a key chosen by two of the experts appears
  twice);
* without a shared expert (``shared_values is None``, routing-only) the
  compressed part ``route_logits[g, i]`` / ``Vt_g`` is left out (the
  routing logits then only choose the experts);
* without routed experts (``topk_index is None`` and ``expert is None``,
  compression-only) only the compressed part remains.

What a backend must do with each field (see :class:`MiTAExperts`): use
``route_logits`` and ``shared_values`` only when ``shared_values`` is not
None; read ``expert`` as ``[G, N, s]`` (``s = experts_per_query``, 1 by
default). What it does not compute it declares in its
:class:`~.declaration.MiTABackend` (the dispatcher refuses such calls before
they reach it). The reference, written out per query, is
:func:`mmseg_mita.ops.naive_mita`.
"""
from typing import Callable, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .plan import MiTAPlan
from .routing import Size


class MiTAExperts(NamedTuple):
    """Shapes use ``G = B * heads`` flattened groups, ``m`` landmarks,
    ``k = min(topk, N)`` routed keys per expert and ``s`` experts per query.

    ``landmarks``: ``R`` [G, m, d];
    ``shared_values``: ``Vt = softmax(s R K^T) V`` [G, m, d], or None
    without a shared expert (routing-only);
    ``route_logits``: ``s^2 q . R`` [G, N, m], the compressed logits (the
    shared expert's keys are ``s R``), whose top-s also route each query;
    ``expert``: the routed experts of each query, best first, [G, N, s]
    (int64), or None without routed experts (compression-only);
    ``topk_index``: the key tokens of each expert [G, m, k] (int64), or
    None without routed experts.
    """
    landmarks: Tensor
    shared_values: Optional[Tensor]
    route_logits: Tensor
    expert: Optional[Tensor]
    topk_index: Optional[Tensor]

    @property
    def experts_per_query(self) -> int:
        """``s``; 0 without routed experts."""
        return 0 if self.expert is None else self.expert.shape[-1]


# pool(tokens [G, H * W, d], hw, pool_size) -> landmarks [G, m, d]
Pooling = Callable[[Tensor, Sequence[Size], Tuple[int, int]], Tensor]


def compute_dtype(q: Tensor, v: Tensor) -> torch.dtype:
    """The one dtype a backend computes in: the autocast dtype under
    autocast (whose inputs may mix float32 and that dtype), else ``v``'s."""
    device = q.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return v.dtype


def softmax_fp32(logits: Tensor, inplace: bool = False) -> Tensor:
    """Softmax over the last dim in float32 at least: a new float32 tensor
    for fp16/bf16 logits; float32/float64 logits are overwritten with
    ``inplace``."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        return torch.softmax(logits.float(), dim=-1)
    return torch.softmax(logits, dim=-1, out=logits if inplace else None)


def pool_landmarks(tokens: Tensor, hw: Sequence[Size],
                   pool_size: Tuple[int, int]) -> Tensor:
    """Landmarks [G, m, d]: ``F.adaptive_avg_pool2d`` to ``pool_size`` of
    ``tokens`` [G, H * W, d] laid out on the row-major ``H x W`` grid."""
    g, _, d = tokens.shape
    grid = tokens.transpose(1, 2).reshape(g, d, *hw)
    return F.adaptive_avg_pool2d(grid, pool_size).flatten(2).transpose(1, 2)


def compute_experts(q: Tensor, k: Tensor, v: Tensor, plan: MiTAPlan,
                    pool: Pooling = pool_landmarks) -> MiTAExperts:
    """Landmarks, shared expert, routing and top-k selection of ``q``,
    ``k``, ``v`` [B, heads, N, d] for the call's ``plan``; ``pool`` pools
    the ``H * W`` pooled queries into landmarks (:func:`pool_landmarks`; the
    export backend passes its fixed-matrix form).

    ``R K^T`` serves both the top-k selection and the shared expert;
    ``R Q^T`` serves both the routing and the compressed logits.
    """
    n, d = plan.num_tokens, plan.head_dim
    q, k, v = (t.reshape(-1, n, d) for t in (q, k, v))
    first, hw = plan.first_pooled, plan.hw
    landmarks = pool(q[:, first:first + hw[0] * hw[1]], hw, plan.pool_size)
    key_logits = landmarks @ k.transpose(1, 2)  # [G, m, N]
    topk_index = expert = shared_values = None
    if plan.routed_experts:
        topk_index = key_logits.topk(plan.topk, dim=-1, sorted=False).indices
    if plan.shared_expert:
        shared_probs = softmax_fp32(key_logits.mul_(plan.scale))
        shared_values = shared_probs.to(v.dtype) @ v
    route_logits = q @ (landmarks * d**-1).transpose(1, 2)  # [G, N, m]
    if plan.routed_experts:
        expert = route_logits.topk(plan.experts_per_query, dim=-1).indices
    return MiTAExperts(landmarks, shared_values, route_logits, expert,
                       topk_index)
