"""Numerical error of a backend in float16/bfloat16, routing held fixed.

Against a float64 reference that routes by itself, low precision also flips
discrete choices: the top-k boundary and the routing argmax have near-ties,
and one flip changes which keys a query sees (on a 20 x 20 grid with
m = k = 49, the torch backend in bf16 is 10 % off the float64 reference
for that reason alone). Here the expert of every query and the top-k keys
of every expert come from the float64 computation; everything else (the
landmarks, the shared expert, the compressed logits, the attention and all
gradients) runs in the low precision. The reference is the torch backend in
float64 with the same routing (exact against the dense per-query reference,
``test_mita_attention.py``).
"""
import torch

from mmseg_mita.ops import compute_experts
from mmseg_mita.ops.torch_backend import mita_torch


def relative_error(got, want) -> float:
    want = want.detach().double().cpu()
    return float((got.detach().double().cpu() - want).norm() / want.norm())


def fixed_routing_errors(backend_fn, inputs, hw, extra, pool, topk, dtype,
                         device, seed=1):
    """Relative errors of the output and of the q, k, v gradients.

    ``inputs``: float64 q, k, v [B, H, N, d] (already rounded to ``dtype``
    so that both sides start from the same values); ``pool`` a pair.
    """
    leaves = [t.detach().requires_grad_() for t in inputs]
    experts = compute_experts(*leaves, hw, extra, pool, topk)
    ref = mita_torch(*leaves, experts)
    gen = torch.Generator().manual_seed(seed)
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, leaves, grad)

    low = [t.detach().to(device, dtype).requires_grad_() for t in inputs]
    low_experts = compute_experts(*low, hw, extra, pool, topk)._replace(
        expert=experts.expert.to(device),
        topk_index=experts.topk_index.to(device))
    out = backend_fn(*low, low_experts)
    assert out.dtype == dtype
    grads = torch.autograd.grad(out, low, grad.to(device, dtype))
    return [relative_error(out, ref)] + [
        relative_error(g, w) for g, w in zip(grads, ref_grads)
    ]
