"""MiTA written out per query: the specification the backends are tested
against (slow: Python loops over batch, heads and queries).

For each head, with ``s = d ** -0.5``, ``N = num_extra_tokens + H * W``
tokens (extra tokens first, then the ``H x W`` patches, row-major):

1. landmarks ``R`` [m, d]: ``adaptive_avg_pool2d`` to ``pool_size``
   (``m = ph * pw``) of the queries of ``H * W`` tokens laid out on the
   ``H x W`` grid: the patches (``landmarks='patches'``) or the first
   ``H * W`` tokens of the sequence (``'official'``);
2. routed expert ``j``: the ``min(topk, N)`` tokens with the largest
   ``R_j . k_t`` (no scale);
3. shared expert: keys ``s R``, values ``Vt = softmax(s R K^T) V`` [m, d];
4. query ``i`` scores the experts by ``R_j . q_i``, goes to its
   ``experts_per_query`` best ``e_1, ..., e_s`` and returns ``softmax(l) @
   w`` with ``l = s q_i . [s R ; K_e1 ; ... ; K_es]^T`` and ``w = [Vt ;
   V_e1 ; ... ; V_es]``: ONE softmax over its ``m`` compressed and ``s * k``
   routed logits. Without the shared expert the ``R`` / ``Vt`` part is left
   out (routing-only); without routed experts only it remains
   (compression-only).

Every product of two vectors is a matrix product here (scores of one query
are ``q_i @ M^T``, one ``mm``), so counting the matmuls of this function
counts MiTA's multiply-adds (``tests/analysis/test_flops.py``).
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from mmseg_mita.utils import IntPair, check_int_pair
from .plan import pooled_tokens
from .options import MiTAOptions, as_options


def naive_mita(q: Tensor, k: Tensor, v: Tensor, hw: IntPair, *,
               num_extra_tokens: int = 1,
               options: Optional[MiTAOptions] = None,
               **option_fields) -> Tensor:
    """MiTA of ``q``, ``k``, ``v`` [B, heads, N, d], one query at a time,
    in the inputs' dtype (use float64 for a reference). Differentiable.
    ``options`` (or its fields as keywords) as for
    :func:`~.mita_attention.mita_attention`."""
    options = as_options(options, option_fields)
    b, h, n, d = q.shape
    hw = check_int_pair(hw, 'hw')
    pool_size, topk = options.pool_size, options.topk
    first = pooled_tokens(num_extra_tokens, options.landmarks)
    s = d**-0.5
    rows = []
    for bi in range(b):
        for hi in range(h):
            qh, kh, vh = q[bi, hi], k[bi, hi], v[bi, hi]
            grid = qh[first:first + hw[0] * hw[1]].T.reshape(1, d, *hw)
            marks = F.adaptive_avg_pool2d(grid, pool_size).reshape(d, -1).T
            key_scores = marks @ kh.T
            chosen = key_scores.topk(min(topk, n), dim=-1).indices
            if options.shared_expert:
                shared_values = torch.softmax(s * key_scores, dim=-1) @ vh
            for i in range(n):
                scores = qh[i] @ marks.T  # routing and compressed logits
                logits, values = [], []
                if options.shared_expert:
                    logits.append(s * s * scores)
                    values.append(shared_values)
                if options.routed_experts:
                    for e in scores.topk(options.experts_per_query).indices:
                        logits.append(s * (qh[i] @ kh[chosen[e]].T))
                        values.append(vh[chosen[e]])
                p = torch.softmax(torch.cat(logits), dim=0)
                rows.append(p @ torch.cat(values))
    return torch.stack(rows).view(b, h, n, d)
