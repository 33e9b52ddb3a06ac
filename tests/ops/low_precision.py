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

Tolerances are calibrated the way flash-attention's tests do it
(:func:`assert_as_accurate_as_torch`): a backend's error at a dtype may be at
most twice the torch backend's error at that dtype, so the bound follows
the dtype instead of being guessed.
"""
import torch

from mita_testing import experts_of, plan_of
from mmseg_mita.ops.torch_backend import attend_experts


def relative_error(got, want) -> float:
    want = want.detach().double().cpu()
    return float((got.detach().double().cpu() - want).norm() / want.norm())


def fixed_routing_errors(backend_fns, inputs, hw, extra, pool, topk, dtype,
                         device, seed=1):
    """Relative errors of the output and of the q, k, v gradients of each
    backend's attention given the shared part (``{name: fn(q, k, v,
    experts)}``: an ``attend_experts``, or :func:`triton_with_routing`),
    against one float64 result: ``{name: [out, dq, dk, dv]}``.

    ``inputs``: float64 q, k, v [B, H, N, d] (already rounded to ``dtype``
    so that both sides start from the same values); ``pool`` a pair.
    """
    leaves = [t.detach().requires_grad_() for t in inputs]
    experts = experts_of(*leaves, hw, extra, pool, topk)
    ref = attend_experts(*leaves, experts)
    gen = torch.Generator().manual_seed(seed)
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    want = [ref] + list(torch.autograd.grad(ref, leaves, grad))

    low = [t.detach().to(device, dtype).requires_grad_() for t in inputs]
    fixed = dict(expert=experts.expert.to(device),
                 topk_index=experts.topk_index.to(device))
    low_experts = experts_of(*low, hw, extra, pool, topk)._replace(**fixed)
    errors = {}
    for name, fn in backend_fns.items():
        out = fn(*low, low_experts)
        assert out.dtype == dtype
        got = [out] + list(
            torch.autograd.grad(out, low, grad.to(device, dtype),
                                retain_graph=True))
        errors[name] = [relative_error(g, w) for g, w in zip(got, want)]
    return errors


def assert_as_accurate_as_torch(backend_fn, inputs, hw, extra, pool, topk,
                                dtype, device, factor=2.0,
                                bounds=(2e-2, 5e-2),
                                baseline_fn=attend_experts):
    """``backend_fn`` (``fn(q, k, v, experts)``, as above) is at
    most ``factor`` times as far from the float64 result as the torch
    backend at the same ``dtype`` and ``device``, for the output and each
    gradient (plus 1e-4 of slack for errors near zero); both stay below
    ``bounds`` (output, gradients), so that an inaccurate baseline is
    noticed too. ``baseline_fn``: the torch backend, replaced only by the
    tests of this helper (``test_low_precision.py``). Returns both error
    lists: ``{'backend': [...], 'torch': [...]}``."""
    errors = fixed_routing_errors(
        {'backend': backend_fn, 'torch': baseline_fn}, inputs, hw, extra,
        pool, topk, dtype, device)
    names = ('out', 'dq', 'dk', 'dv')
    for name, got, base in zip(names, errors['backend'], errors['torch']):
        assert got <= factor * base + 1e-4, (
            f'{name}: relative error {got:.3g} to float64, more than '
            f'{factor}x the torch backend\'s {base:.3g} ({errors})')
    for errs in errors.values():
        assert errs[0] < bounds[0] and max(errs[1:]) < bounds[1], errors
    return errors


def triton_with_routing(hw, extra, pool):
    """The fused Triton backend as ``fn(q, k, v, experts)`` that computes
    with the routing of ``experts`` (its expert of each query and top-k
    keys; the rest it computes itself)."""
    from mmseg_mita.ops import triton_backend

    def fn(q, k, v, experts):
        plan = plan_of(q, hw, extra, pool, experts.topk_index.shape[-1])
        return triton_backend.mita_triton_routed(q, k, v, plan,
                                                 experts.expert[..., 0],
                                                 experts.topk_index)

    return fn
