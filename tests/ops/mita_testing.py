"""Inputs, the float64 comparison and a plain flash-attn stand-in shared by
the operator tests (low-precision comparisons: ``low_precision.py``)."""
import torch

from mmseg_mita.ops import (MiTAOptions, MiTAPlan, compute_experts,
                            get_backend, naive_mita)


def flash_attn_runs() -> bool:
    """CUDA is present and the flash backend's required modules (its
    declaration's ``requires``: flash-attn) are installed."""
    return torch.cuda.is_available() and get_backend('flash').available()


def random_qkv(b, h, n, d, dtype=torch.float64, seed=0, device='cpu'):
    """Three random [b, h, n, d] tensors that require grad."""
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(b, h, n, d, generator=gen, dtype=dtype).to(
            device).requires_grad_() for _ in range(3)
    ]


def aligned_qkv(b, h, n, d, spread=0.01, seed=3):
    """Like :func:`random_qkv`, but every query lies within ``spread`` of one
    direction, so that one landmark wins them all: one expert gets every
    query. k and v come from ``random_qkv(..., seed=seed + 1)``."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(d, generator=gen, dtype=torch.float64)
    q = base + spread * torch.randn(b, h, n, d, generator=gen,
                                    dtype=torch.float64)
    k, v = random_qkv(b, h, n, d, seed=seed + 1)[:2]
    return [q.requires_grad_(), k, v]


def plan_of(q, hw, extra, pool, topk, dropout_p=0.0, **variant):
    """The :class:`MiTAPlan` of a call on ``q`` with positional options (the
    test tables' order) and the variant's fields as keywords."""
    options = MiTAOptions(pool_size=pool, topk=topk, **variant)
    return MiTAPlan.build(q, hw, extra, options, dropout_p)


def experts_of(q, k, v, hw, extra, pool, topk, **variant):
    """:func:`compute_experts` with positional options (the test tables'
    order) and the variant's fields as keywords."""
    return compute_experts(q, k, v,
                           plan_of(q, hw, extra, pool, topk, **variant))


def reference(q, k, v, hw, extra, pool, topk):
    """:func:`naive_mita` with positional options (the test tables' order)."""
    return naive_mita(q, k, v, hw, num_extra_tokens=extra, pool_size=pool,
                      topk=topk)


def assert_matches_reference(out, ref, inputs, rtol=1e-10, atol=1e-10,
                             grad_rtol=1e-9, grad_atol=1e-9):
    """``out`` is ``ref``, and so are their gradients with respect to those
    of ``inputs`` (q, k, v) that require grad, under one random upstream
    gradient. The default tolerances are float64's."""
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
    grad = torch.randn_like(out)
    named = [(name, t) for name, t in zip('qkv', inputs) if t.requires_grad]
    leaves = [t for _, t in named]
    got = torch.autograd.grad(out, leaves, grad)
    want = torch.autograd.grad(ref, leaves, grad.to(ref))
    for (name, _), g1, g2 in zip(named, got, want):
        torch.testing.assert_close(g1, g2, rtol=grad_rtol, atol=grad_atol,
                                   msg=lambda m: f'grad of {name}: {m}')


def assert_topk_is_largest(landmarks, k, topk_index, rtol=1e-4):
    """``topk_index`` [G, m, topk] (a forward's routed keys) holds, for
    every landmark of ``landmarks`` [G, m, d], distinct tokens whose logits
    ``R K^T`` (float64, on the stored landmarks and the keys ``k`` [B, H,
    N, d]) are the largest up to a float32 product's rounding: no token
    left out beats one selected by more than ``rtol`` of the largest
    ``|R| |K|^T`` (what a top-k over the kernel's own logits gives)."""
    r = landmarks.double()
    keys = k.detach().flatten(0, 1).double()
    logits = r @ keys.transpose(1, 2)
    tol = rtol * float((r.abs() @ keys.abs().transpose(1, 2)).amax())
    index = topk_index.long()
    ordered = index.sort(-1).values
    assert (ordered[..., 1:] != ordered[..., :-1]).all(), 'a token twice'
    chosen = torch.zeros_like(logits, dtype=torch.bool).scatter_(
        -1, index, True)
    lowest = logits.masked_fill(~chosen, float('inf')).amin(-1)
    highest = logits.masked_fill(chosen, -float('inf')).amax(-1)
    worst = float((highest - lowest).amax())
    assert worst <= tol, f'a token left out beats a selected one by {worst}'


def assert_same_gradients(got, want, rtol, atol):
    """Each gradient of ``got`` equals that of ``want``, and none of
    ``want`` is all zero (a compiled backward that drops the gradient must
    not pass against an eager one that lost it too)."""
    assert len(got) == len(want)
    for i, (g1, g2) in enumerate(zip(got, want)):
        assert bool(g2.ne(0).any()), f'gradient {i} is all zero in eager'
        torch.testing.assert_close(g1, g2, rtol=rtol, atol=atol,
                                   msg=lambda m: f'gradient {i}: {m}')


class ScaleGrad(torch.autograd.Function):
    """Identity whose backward scales the gradient by ``scale``: a backend
    with one wrong gradient, for the tests of the comparison helpers."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


def plain_varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k,
                           max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False):
    """``flash_attn_varlen_func``'s contract, one sequence at a time."""
    assert q.dim() == k.dim() == v.dim() == 3 and not causal
    assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
    assert dropout_p == 0.0
    len_q = cu_seqlens_q.diff()
    len_k = cu_seqlens_k.diff()
    assert int(len_q.min()) > 0, 'an empty query sequence reached the kernel'
    assert int(len_q.max()) == max_seqlen_q
    assert int(len_k.max()) == max_seqlen_k
    assert int(cu_seqlens_q[-1]) == q.shape[0]
    assert int(cu_seqlens_k[-1]) == k.shape[0]
    out = []
    for i in range(len(len_q)):
        qs = q[cu_seqlens_q[i]:cu_seqlens_q[i + 1]].transpose(0, 1)
        ks = k[cu_seqlens_k[i]:cu_seqlens_k[i + 1]].transpose(0, 1)
        vs = v[cu_seqlens_k[i]:cu_seqlens_k[i + 1]].transpose(0, 1)
        probs = torch.softmax(softmax_scale * qs @ ks.transpose(1, 2), -1)
        out.append((probs @ vs).transpose(0, 1))
    return torch.cat(out)
