"""Attention dropout of the operator, and checks that must hold per axis.

Dropout keeps each of the ``m + k`` probabilities with probability
``1 - p`` and scales the kept ones by ``1 / (1 - p)``, so its expectation
is the output (and the gradient) without dropout.
"""
import pytest
import torch

from mmseg_mita.ops import mita_attention

HW, EXTRA, POOL, TOPK = (4, 5), 1, 2, 6


def _qkv(b=1, h=2, d=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = EXTRA + HW[0] * HW[1]
    return [
        torch.randn(b, h, n, d, generator=gen, dtype=torch.float64)
        for _ in range(3)
    ]


def _mita(q, k, v, dropout_p, seed=None, backend='torch', **variant):
    """MiTA on the module's grid (``variant``: the operator's variant
    options); with ``seed``, its dropout mask is fixed (without touching the
    global random state)."""
    with torch.random.fork_rng():
        if seed is not None:
            torch.manual_seed(seed)
        return mita_attention(q, k, v, HW, num_extra_tokens=EXTRA,
                              pool_size=POOL, topk=TOPK, backend=backend,
                              dropout_p=dropout_p, **variant)


# Every computation path of the torch backend: one expert and the shared
# one, several experts, routing only (all three ExpertBlockAttention),
# compression only (a plain softmax).
VARIANTS = {
    'default': {},
    'two_experts': dict(experts_per_query=2),
    'routing_only': dict(shared_expert=False),
    'compression_only': dict(routed_experts=False),
}


@pytest.mark.parametrize('variant', list(VARIANTS))
def test_dropout_is_unbiased_forward_and_backward(variant):
    # 2000 copies of one input in a batch draw 2000 independent masks. Their
    # mean must be the output without dropout, and so must the gradients
    # (summed over the copies by autograd). Without the 1 / (1 - p) scale
    # the means would be (1 - p) times them: a relative error of p = 0.4;
    # with it they are within 0.011 to 0.031 (measured, every variant; the
    # bound leaves 2.5x).
    copies, p = 2000, 0.4
    options = VARIANTS[variant]
    q, k, v = _qkv()
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(1),
                       dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    plain = _mita(*leaves, 0.0, **options)
    want = [plain.detach()] + list(torch.autograd.grad(plain, leaves, grad))
    dropped = _mita(*(t.expand(copies, -1, -1, -1) for t in leaves), p,
                    seed=0, **options)
    got = [dropped.detach().mean(0, keepdim=True)] + [
        g / copies for g in torch.autograd.grad(
            dropped, leaves, grad.expand(copies, -1, -1, -1))
    ]
    for name, g, w in zip(('out', 'dq', 'dk', 'dv'), got, want):
        rel = float((g - w).norm() / w.norm())
        assert rel < 0.08, f'{name}: mean over masks is off by {rel:.3f}'


def test_dropout_backward_matches_its_forward():
    # The same mask in every call (fixed seed, unchanged routing): the hand
    # written backward must be the derivative of the forward.
    q, k, v = (t.requires_grad_() for t in _qkv(h=1, d=4))
    assert torch.autograd.gradcheck(
        lambda *qkv: _mita(*qkv, dropout_p=0.3, seed=0), (q, k, v),
        fast_mode=True)


def test_dropout_mask_follows_the_random_state():
    q, k, v = _qkv()
    plain = _mita(q, k, v, 0.0)
    a, b = (_mita(q, k, v, 0.3, seed=s) for s in (0, 1))
    assert not torch.allclose(a, plain) and not torch.allclose(a, b)
    torch.testing.assert_close(_mita(q, k, v, 0.3, seed=0), a, rtol=0,
                               atol=0)


def test_flash_attn_receives_dropout_p(plain_flash):
    """The probability reaches flash-attn (here a plain stand-in on CPU)."""
    q, k, v = _qkv()
    _mita(q, k, v, 0.0, backend='flash')
    _mita(q, k, v, 0.25, backend='flash')
    assert plain_flash == [0.0, 0.25]


@pytest.mark.parametrize('pool_size', [(5, 2), (2, 7), (5, 7)])
def test_pool_size_checked_along_each_axis(pool_size):
    q = torch.randn(1, 2, 1 + 4 * 6, 8)
    with pytest.raises(ValueError, match=r'pool_size=\(\d, \d\) is larger '
                       r'than the patch grid hw=\(4, 6\)'):
        mita_attention(q, q, q, (4, 6), pool_size=pool_size, topk=4)


@pytest.mark.parametrize('pool_size', [(4, 2), (2, 6), (4, 6)])
def test_pool_size_up_to_the_grid_is_accepted(pool_size):
    q = torch.randn(1, 2, 1 + 4 * 6, 8)
    assert mita_attention(q, q, q, (4, 6), pool_size=pool_size,
                          topk=4).shape == q.shape
