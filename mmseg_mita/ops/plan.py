"""The plan of one MiTA call: the options resolved against the inputs, once.

:func:`~.mita_attention.mita_attention` checks its inputs, builds one
:class:`MiTAPlan` and hands every backend the same call, ``run(q, k, v,
plan) -> out`` (:class:`~.declaration.MiTABackend`). The plan holds every
size and choice a backend needs (the patch grid, the landmark grid, the
top-k clipped to ``N``, the first pooled token, the softmax scale, the
variant, the dropout), so no backend reads the options or repacks sizes.
"""
import dataclasses
from typing import Tuple

import torch
from torch import Tensor

from .options import MiTAOptions
from .routing import Size


def pooled_tokens(num_extra_tokens: int, landmarks: str) -> int:
    """Index of the first of the ``H * W`` tokens whose queries are pooled
    into landmarks: the patches (``'patches'``), or the sequence from its
    start (``'official'``, the authors' ``q[:, :-1]`` with one cls token)."""
    return num_extra_tokens if landmarks == 'patches' else 0


def clipped_topk(topk: int, num_tokens: Size) -> Size:
    """``min(topk, N)``; a traced size when N is one (ONNX export), so that
    an exported ``TopK`` follows the input's N."""
    if isinstance(num_tokens, Tensor):
        return torch.clamp(num_tokens, max=topk)
    return min(topk, num_tokens)


@dataclasses.dataclass(frozen=True)
class MiTAPlan:
    """What one call computes (see :func:`~.mita_attention.mita_attention`).

    Sizes are ints, or traced sizes (0-dim tensors) where the caller is
    traced for ONNX export (``hw``, ``num_tokens``, ``topk``).

    Attributes:
        hw: the patch grid (H, W).
        num_extra_tokens: tokens before the patches (the cls token).
        num_tokens: ``N = num_extra_tokens + H * W``.
        head_dim: ``d``.
        scale: ``d ** -0.5``, the softmax scale.
        pool_size: the landmark grid (ph, pw); ``num_landmarks = ph * pw``.
        num_landmarks: ``m``.
        first_pooled: the first of the ``H * W`` tokens whose queries are
            pooled into landmarks (:func:`pooled_tokens`).
        landmarks: the landmark convention it came from.
        topk: keys per routed expert, ``min(options.topk, N)``.
        experts_per_query, shared_expert, routed_experts: the variant, as in
            :class:`~.options.MiTAOptions`.
        dropout_p: dropout on the attention probabilities.
    """
    hw: Tuple[Size, Size]
    num_extra_tokens: int
    num_tokens: Size
    head_dim: int
    scale: float
    pool_size: Tuple[int, int]
    num_landmarks: int
    first_pooled: int
    landmarks: str
    topk: Size
    experts_per_query: int
    shared_expert: bool
    routed_experts: bool
    dropout_p: float

    @classmethod
    def build(cls, q: Tensor, hw: Tuple[Size, Size], num_extra_tokens: int,
              options: MiTAOptions, dropout_p: float = 0.0) -> 'MiTAPlan':
        """The plan of MiTA with ``options`` on ``q`` [B, heads, N, d],
        arguments already checked (:func:`~.mita_attention.check_inputs`).
        """
        num_tokens = q.shape[2]
        head_dim = int(q.shape[3])  # a constant of the model, also traced
        return cls(
            hw=tuple(hw),
            num_extra_tokens=num_extra_tokens,
            num_tokens=num_tokens,
            head_dim=head_dim,
            scale=head_dim**-0.5,
            pool_size=options.pool_size,
            num_landmarks=options.num_landmarks,
            first_pooled=pooled_tokens(num_extra_tokens, options.landmarks),
            landmarks=options.landmarks,
            topk=clipped_topk(options.topk, num_tokens),
            experts_per_query=options.experts_per_query,
            shared_expert=options.shared_expert,
            routed_experts=options.routed_experts,
            dropout_p=dropout_p)
