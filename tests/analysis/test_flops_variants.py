"""FLOPs of MiTA's variants: the closed form of the counted op against the
multiply-adds of the per-query specification, counted by PyTorch."""
import pytest
import torch
from flops_testing import layer_counts
from torch.utils.flop_counter import FlopCounterMode

from mmseg_mita.analysis import mita_op_flops
from mmseg_mita.models import MiTAViT
from mmseg_mita.ops import MiTAOptions, naive_mita

VARIANTS = [
    # experts_per_query, shared_expert, routed_experts
    (1, True, True), (2, True, True), (3, True, True), (1, False, True),
    (2, False, True), (1, True, False)
]


def _options(pool, topk, s, shared, routed):
    return MiTAOptions(pool_size=pool, topk=topk, experts_per_query=s,
                       shared_expert=shared, routed_experts=routed)


def _matmul_part(flops):
    """The closed form's matmuls (the landmark pooling is no matmul)."""
    return sum(v for key, v in flops.items() if key != 'mita_landmark_pool')


def _counted_multiply_adds(fn):
    """Multiply-adds of the matmuls ``fn`` runs (PyTorch counts 2 FLOPs
    per multiply-add)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops() // 2


@pytest.mark.parametrize('s,shared,routed', VARIANTS)
@pytest.mark.parametrize('b,h,hw,extra,pool,topk', [
    (2, 3, (3, 4), 1, (2, 2), 5),
    (1, 2, (4, 4), 0, (2, 3), 100),  # topk >= N
])
def test_closed_form_counts_the_specification(b, h, hw, extra, pool, topk,
                                              s, shared, routed):
    d = 4
    n = extra + hw[0] * hw[1]
    q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
    counted = _counted_multiply_adds(lambda: naive_mita(
        q, k, v, hw, num_extra_tokens=extra, pool_size=pool, topk=topk,
        experts_per_query=s, shared_expert=shared, routed_experts=routed))
    closed = mita_op_flops(b, h, n, d, extra, _options(pool, topk, s,
                                                       shared, routed))
    assert _matmul_part(closed) == counted
    assert closed['mita_landmark_pool'] == b * h * d * hw[0] * hw[1]


def test_variants_cost_what_the_paper_says():
    # Per query and channel: m + s k logits and as many weighted values,
    # plus 3 m (2 m without a shared expert) for the landmark matmuls.
    n, m, k = 1025, 49, 49
    cost = {
        v: _matmul_part(mita_op_flops(1, 1, n, 1, 1, _options(7, k, *v))) / n
        for v in VARIANTS
    }
    assert cost[(1, True, True)] == 4 * m + 2 * k
    assert cost[(2, True, True)] == 4 * m + 4 * k
    assert cost[(2, False, True)] == 2 * m + 4 * k
    assert cost[(1, True, False)] == 4 * m


@pytest.mark.parametrize('s,shared,routed', VARIANTS[1:])
def test_traced_layer_counts_the_variant(s, shared, routed):
    hw, c = (5, 7), 48
    vit = MiTAViT(img_size=(64, 64), patch_size=8, embed_dims=c,
                  num_layers=1, num_heads=3,
                  mita_cfg=dict(pool_size=(2, 3), topk=9,
                                experts_per_query=s, shared_expert=shared,
                                routed_experts=routed))
    count, _, calls = layer_counts(vit, 2, hw, c)
    assert calls == 1
    closed = mita_op_flops(2, 3, 36, 16, 1,
                           _options((2, 3), 9, s, shared, routed))
    assert count == _matmul_part(closed)
