"""Worst cases, partial gradients, dropout, low precision and memory scaling
of the torch backend, against the dense float64 reference."""
import pytest
import torch
from mita_testing import (aligned_qkv, assert_matches_reference, random_qkv,
                          reference)

from mmseg_mita.ops import mita_attention
from mmseg_mita.bench.measure import peak_memory


def _check_against_reference(q, k, v, hw, extra, pool, topk, **kwargs):
    out = mita_attention(q, k, v, hw, num_extra_tokens=extra, pool_size=pool,
                         topk=topk, backend='torch', **kwargs)
    assert_matches_reference(out, reference(q, k, v, hw, extra, pool, topk),
                             (q, k, v))


@pytest.mark.parametrize('b,h,hw,extra,pool,topk', [
    (1, 2, (7, 7), 1, 7, 49),   # N = 50 with the default m = k = 49
    (4, 16, (4, 4), 1, 2, 3),   # B * heads = 64 groups
    (1, 1, (3, 4), 0, (1, 1), 3),  # a single expert
])
def test_worst_cases_match_reference(b, h, hw, extra, pool, topk):
    n = extra + hw[0] * hw[1]
    _check_against_reference(*random_qkv(b, h, n, 8), hw, extra, pool, topk)


def test_one_expert_gets_every_query_with_gradients():
    hw, d = (9, 9), 8
    n = 1 + hw[0] * hw[1]
    _check_against_reference(*aligned_qkv(1, 2, n, d), hw, 1, 3, 5)


@pytest.mark.parametrize('needs', ['q', 'k', 'v', 'kv', 'qv'])
def test_gradients_of_a_subset_ofrandom_qkv(needs):
    hw = (6, 5)
    q, k, v = (t.detach().requires_grad_(name in needs)
               for name, t in zip('qkv', random_qkv(2, 2, 31, 8)))
    _check_against_reference(q, k, v, hw, 1, 2, 6)


def test_no_grad_forward_matches_reference():
    q, k, v = random_qkv(1, 2, 26, 8)
    with torch.no_grad():
        out = mita_attention(q, k, v, (5, 5), pool_size=2, topk=4,
                             backend='torch')
    torch.testing.assert_close(out, reference(q, k, v, (5, 5), 1, 2, 4),
                               rtol=1e-10, atol=1e-10)


def test_bad_dropout_is_rejected():
    q = torch.randn(1, 1, 17, 4)
    with pytest.raises(ValueError, match='dropout_p'):
        mita_attention(q, q, q, (4, 4), pool_size=2, topk=3, dropout_p=1.0)


# The default variant and the paper's ablations (tests/ops/test_variants.py).
VARIANTS = [
    dict(),
    dict(experts_per_query=2),
    dict(experts_per_query=2, shared_expert=False),
    dict(routed_experts=False),
]
VARIANT_IDS = ['default', 's2', 's2-no-shared', 'no-routed']


@pytest.mark.parametrize('variant', VARIANTS, ids=VARIANT_IDS)
def test_bfloat16_close_to_float32(variant):
    # The same bf16-rounded inputs in float32 and in bfloat16; topk >= N so
    # that rounding cannot swap a routed key (a legitimate difference).
    q, k, v = (t.detach().bfloat16() for t in random_qkv(2, 2, 65, 32))
    full = [t.float().requires_grad_() for t in (q, k, v)]
    low = [t.requires_grad_() for t in (q, k, v)]
    outs = [
        mita_attention(*inputs, (8, 8), pool_size=4, topk=100,
                       backend='torch', **variant) for inputs in (full, low)
    ]
    assert outs[1].dtype == torch.bfloat16
    grad = torch.randn_like(outs[0])
    outs[0].backward(grad)
    outs[1].backward(grad.bfloat16())
    pairs = [(outs[0], outs[1])]
    pairs += [(a.grad, b.grad) for a, b in zip(full, low)]
    for want, got in pairs:
        assert got.dtype == torch.bfloat16
        assert (got.float() - want).norm() / want.norm() < 0.02


@pytest.mark.parametrize('variant', VARIANTS, ids=VARIANT_IDS)
def test_peak_memory_grows_linearly_with_tokens(variant):
    # An N x N tensor anywhere would make 4x the tokens cost ~16x memory.
    cpu = torch.device('cpu')

    def peak(side):
        n = 1 + side * side
        q, k, v = (torch.randn(1, 1, n, 32, requires_grad=True)
                   for _ in range(3))
        grad = torch.randn(1, 1, n, 32)
        return peak_memory(
            lambda: mita_attention(q, k, v, (side, side), backend='torch',
                                   **variant).backward(grad), cpu)

    assert peak(64) / peak(32) < 4.5
