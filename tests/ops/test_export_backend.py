"""The export formulation (backend='export') and the fixed adaptive pooling
against the operator's torch backend and F.adaptive_avg_pool2d."""
import pytest
import torch
import torch.nn.functional as F

from mita_testing import experts_of

from mmseg_mita.ops import mita_attention
from mmseg_mita.ops.fixed_pooling import (FixedAdaptiveAvgPool2d,
                                          adaptive_avg_pool2d_fixed)

CASES = [
    # B, heads, hw, extra, pool, topk
    (2, 3, (7, 11), 1, 3, 5),  # grid not divisible by the pool
    (1, 2, (5, 5), 0, 2, 4),
    (2, 1, (6, 9), 1, (2, 4), 7),
    (1, 2, (4, 6), 1, 4, 1000),  # topk >= N: every key
    (1, 1, (3, 3), 0, 3, 9),  # every patch its own landmark
    (3, 4, (8, 5), 2, (3, 2), 6),
    (1, 2, (13, 10), 1, 7, 49),
]


def _inputs(b, h, n, d, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(b, h, n, d, generator=gen, dtype=dtype) for _ in range(3)
    ]


@pytest.mark.parametrize('dtype,tol', [(torch.float64, 1e-12),
                                       (torch.float32, 1e-5)])
@pytest.mark.parametrize('b,h,hw,extra,pool,topk,landmarks', [
    case + ('patches', ) for case in CASES
] + [case + ('official', ) for case in CASES if case[3] == 1])
def test_export_backend_matches_torch_backend(b, h, hw, extra, pool, topk,
                                              landmarks, dtype, tol):
    n = extra + hw[0] * hw[1]
    q, k, v = _inputs(b, h, n, 16, dtype)
    kwargs = dict(num_extra_tokens=extra, pool_size=pool, topk=topk,
                  landmarks=landmarks)
    out = mita_attention(q, k, v, hw, backend='export', **kwargs)
    ref = mita_attention(q, k, v, hw, backend='torch', **kwargs)
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)


def test_export_backend_one_expert_for_every_query():
    b, h, hw, d = 1, 2, (6, 6), 8
    n = 1 + hw[0] * hw[1]
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(d, generator=gen, dtype=torch.float64)
    q = base + 0.01 * torch.randn(b, h, n, d, generator=gen,
                                  dtype=torch.float64)
    k, v = _inputs(b, h, n, d, torch.float64, seed=2)[:2]
    experts = experts_of(q, k, v, hw, 1, (3, 3), 5)
    assert (experts.expert == experts.expert[:, :1]).all()
    out = mita_attention(q, k, v, hw, pool_size=3, topk=5, backend='export')
    ref = mita_attention(q, k, v, hw, pool_size=3, topk=5, backend='torch')
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_export_backend_refuses_dropout():
    q, k, v = _inputs(1, 1, 10, 4, torch.float32)
    with pytest.raises(ValueError, match='does not implement attention dropout'):
        mita_attention(q, k, v, (3, 3), pool_size=2, topk=3,
                       backend='export', dropout_p=0.1)


@pytest.mark.parametrize('size,out', [((7, 11), (3, 3)), ((32, 32), (10, 10)),
                                      ((4, 6), (10, 10)), ((6, 6), (1, 2)),
                                      ((16, 16), (6, 6)), ((5, 9), (5, 9))])
def test_fixed_pooling_equals_adaptive_avg_pool(size, out):
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    torch.testing.assert_close(
        adaptive_avg_pool2d_fixed(x, out), F.adaptive_avg_pool2d(x, out),
        rtol=1e-12, atol=1e-12)
    pool = FixedAdaptiveAvgPool2d(out)
    x32 = x.float()
    torch.testing.assert_close(pool(x32), F.adaptive_avg_pool2d(x32, out),
                               rtol=1e-6, atol=1e-6)


def test_fixed_pooling_module_rejects_open_sizes():
    with pytest.raises(ValueError, match='output_size'):
        FixedAdaptiveAvgPool2d((None, 3))
