"""The part of MiTA that every backend shares, and the seam to backends.

:func:`compute_experts` computes, once per call, everything that does not
depend on which expert a query reads: the landmarks, the top-k key
selection, the shared expert and the routing. A backend then only computes
each query's one softmax over its ``m`` compressed and ``k`` routed logits.

The seam (:data:`Backend`): a backend is a function
``backend(q, k, v, experts, dropout_p) -> out`` with

* ``q``, ``k``, ``v``: ``[B, heads, N, d]``, one dtype; ``out`` the same;
* ``experts``: a :class:`MiTAExperts` computed from these ``q``, ``k``,
  ``v``; its ``route_logits`` and ``shared_values`` carry the autograd graph
  back to ``q`` (through the landmarks) and to ``k``, ``v`` (through the
  shared expert): a backend differentiates its output with respect to them,
  and to ``q``, ``k``, ``v`` directly (routed logits and values); the index
  tensors have no gradient;
* ``dropout_p``: dropout on the ``m + k`` attention probabilities (0 in
  evaluation); a backend that cannot apply it raises ``ValueError``.

For query ``i`` of group ``g`` with expert ``e = expert[g, i]``, every
backend returns ``softmax(l) @ [Vt_g ; V_g[T]]`` where
``l = [route_logits[g, i] ; s q_i . K_g[T]^T]`` and ``T = topk_index[g, e]``
(the reference, written out per query, is :func:`mmseg_mita.ops.naive_mita`).
"""
from typing import Callable, NamedTuple, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


class MiTAExperts(NamedTuple):
    """Shapes use ``G = B * heads`` flattened groups, ``m`` landmarks and
    ``k = min(topk, N)`` routed keys per expert.

    ``landmarks``: ``R`` [G, m, d];
    ``shared_values``: ``Vt = softmax(s R K^T) V`` [G, m, d];
    ``route_logits``: ``s^2 q . R`` [G, N, m], the compressed logits (the
    shared expert's keys are ``s R``), whose argmax also routes each query;
    ``expert``: the routed expert of each query [G, N] (int64);
    ``topk_index``: the key tokens of each expert [G, m, k] (int64).
    """
    landmarks: Tensor
    shared_values: Tensor
    route_logits: Tensor
    expert: Tensor
    topk_index: Tensor


Backend = Callable[[Tensor, Tensor, Tensor, MiTAExperts, float], Tensor]


def softmax_fp32(logits: Tensor, inplace: bool = False) -> Tensor:
    """Softmax over the last dim in float32 at least: a new float32 tensor
    for fp16/bf16 logits; float32/float64 logits are overwritten with
    ``inplace``."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        return torch.softmax(logits.float(), dim=-1)
    return torch.softmax(logits, dim=-1, out=logits if inplace else None)


def compute_experts(q: Tensor, k: Tensor, v: Tensor, hw: Tuple[int, int],
                    num_extra_tokens: int, pool_size: Tuple[int, int],
                    topk: int) -> MiTAExperts:
    """Landmarks, shared expert, routing and top-k selection of ``q``,
    ``k``, ``v`` [B, heads, N, d] (arguments already checked).

    ``R K^T`` serves both the top-k selection and the shared expert;
    ``R Q^T`` serves both the routing and the compressed logits.
    """
    b, h, n, d = q.shape
    g = b * h
    q, k, v = (t.reshape(g, n, d) for t in (q, k, v))
    patches = q[:, num_extra_tokens:].transpose(1, 2).reshape(g, d, *hw)
    landmarks = F.adaptive_avg_pool2d(patches, pool_size).flatten(2)
    landmarks = landmarks.transpose(1, 2)  # [G, m, d]
    key_logits = landmarks @ k.transpose(1, 2)  # [G, m, N]
    topk_index = key_logits.topk(min(topk, n), dim=-1, sorted=False).indices
    shared_probs = softmax_fp32(key_logits.mul_(d**-0.5))
    shared_values = shared_probs.to(v.dtype) @ v
    route_logits = q @ (landmarks * d**-1).transpose(1, 2)  # [G, N, m]
    expert = route_logits.argmax(dim=-1)
    return MiTAExperts(landmarks, shared_values, route_logits, expert,
                       topk_index)
