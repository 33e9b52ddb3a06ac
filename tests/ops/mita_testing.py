"""Inputs and comparisons shared by the operator tests."""
import torch

from mmseg_mita.ops import naive_mita


def random_qkv(b, h, n, d, dtype=torch.float64, seed=0, device='cpu'):
    """Three random [b, h, n, d] tensors that require grad."""
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(b, h, n, d, generator=gen, dtype=dtype).to(
            device).requires_grad_() for _ in range(3)
    ]


def reference(q, k, v, hw, extra, pool, topk):
    """:func:`naive_mita` with positional options (the test tables' order)."""
    return naive_mita(q, k, v, hw, num_extra_tokens=extra, pool_size=pool,
                      topk=topk)


def outputs_and_grads(fn, inputs, grad):
    """``fn(*inputs)`` and the gradients of ``(fn(*inputs) * grad).sum()``
    with respect to ``inputs`` (fresh leaves), all as float64 on the CPU."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, grad.to(out))
    return [t.detach().double().cpu() for t in (out, *grads)]


def assert_as_close_as_baseline(fn, baseline, inputs, reference_fn,
                                factor=2.0, names=('out', 'dq', 'dk', 'dv')):
    """Low-precision check in the manner of flash-attention's tests.

    ``fn`` and ``baseline`` run on ``inputs`` (same device and dtype);
    ``reference_fn`` on the same values in float64. The largest error of
    ``fn``'s output and of each gradient to the reference must be at most
    ``factor`` times the baseline's (plus a few float64 ulps), so the
    tolerance follows the dtype instead of being guessed.
    """
    exact = [t.detach().double().cpu() for t in inputs]
    out64 = reference_fn(*[t.clone().requires_grad_() for t in exact])
    grad = torch.randn(out64.shape, generator=torch.Generator().manual_seed(
        1), dtype=torch.float64)
    want = outputs_and_grads(reference_fn, exact, grad)
    got = outputs_and_grads(fn, inputs, grad.to(inputs[0]))
    base = outputs_and_grads(baseline, inputs, grad.to(inputs[0]))
    for name, g, b, w in zip(names, got, base, want):
        err = float((g - w).abs().max())
        base_err = float((b - w).abs().max())
        assert err <= factor * base_err + 1e-12, (
            f'{name}: error {err:.3g} to the float64 reference, more than '
            f'{factor}x the baseline\'s {base_err:.3g}')
