"""MiTA written out per query: the specification the backends are tested
against (slow: Python loops over batch, heads and queries).

For each head, with ``s = d ** -0.5``, ``N = num_extra_tokens + H * W``
tokens (extra tokens first, then the ``H x W`` patches, row-major):

1. landmarks ``R`` [m, d]: ``adaptive_avg_pool2d`` of the patch queries on
   their grid to ``pool_size`` (``m = ph * pw``);
2. routed expert ``j``: the ``min(topk, N)`` tokens with the largest
   ``R_j . k_t`` (no scale);
3. shared expert: keys ``s R``, values ``Vt = softmax(s R K^T) V`` [m, d];
4. query ``i`` goes to ``e = argmax_j R_j . q_i`` and returns
   ``softmax(s q_i . [s R ; K_e]^T) @ [Vt ; V_e]``: ONE softmax over its
   ``m`` compressed and ``k`` routed logits.
"""
import torch
import torch.nn.functional as F
from torch import Tensor

from mmseg_mita.utils import IntPair, check_int_pair


def naive_mita(q: Tensor, k: Tensor, v: Tensor, hw: IntPair, *,
               num_extra_tokens: int = 1, pool_size: IntPair = 7,
               topk: int = 49) -> Tensor:
    """MiTA of ``q``, ``k``, ``v`` [B, heads, N, d], one query at a time,
    in the inputs' dtype (use float64 for a reference). Differentiable."""
    b, h, n, d = q.shape
    hw = check_int_pair(hw, 'hw')
    pool_size = check_int_pair(pool_size, 'pool_size')
    s = d**-0.5
    rows = []
    for bi in range(b):
        for hi in range(h):
            qh, kh, vh = q[bi, hi], k[bi, hi], v[bi, hi]
            grid = qh[num_extra_tokens:].T.reshape(1, d, *hw)
            landmarks = F.adaptive_avg_pool2d(grid, pool_size).reshape(d, -1).T
            key_scores = landmarks @ kh.T
            chosen = key_scores.topk(min(topk, n), dim=-1).indices
            shared_values = torch.softmax(s * key_scores, dim=-1) @ vh
            for i in range(n):
                e = int(torch.argmax(landmarks @ qh[i]))
                keys = torch.cat([s * landmarks, kh[chosen[e]]])
                values = torch.cat([shared_values, vh[chosen[e]]])
                p = torch.softmax(s * (keys @ qh[i]), dim=0)
                rows.append(p @ values)
    return torch.stack(rows).view(b, h, n, d)
