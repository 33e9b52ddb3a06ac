"""The MiTA operator against a plain dense, per-query reference (float64)."""
import pytest
import torch
from mita_testing import (aligned_qkv, assert_matches_reference, random_qkv,
                          reference)

from mmseg_mita.ops import mita_attention

CASES = [
    # B, heads, hw, extra, pool, topk
    (2, 3, (7, 11), 1, 3, 5),
    (1, 2, (5, 5), 0, 2, 4),
    (2, 1, (6, 9), 1, (2, 4), 7),
    (1, 2, (4, 6), 1, 4, 1000),   # topk >= N: every key
    (1, 1, (3, 3), 0, 3, 9),      # every patch its own landmark
    (3, 4, (8, 5), 2, (3, 2), 6),  # grid not divisible by pool
]


@pytest.mark.parametrize('b,h,hw,extra,pool,topk', CASES)
def test_torch_backend_matches_reference(b, h, hw, extra, pool, topk):
    n = extra + hw[0] * hw[1]
    q, k, v = random_qkv(b, h, n, 16)
    out = mita_attention(q, k, v, hw, num_extra_tokens=extra,
                         pool_size=pool, topk=topk, backend='torch')
    assert_matches_reference(out, reference(q, k, v, hw, extra, pool, topk),
                             (q, k, v))


def test_all_queries_routed_to_one_expert():
    # Queries that all align with one landmark direction: one expert gets
    # every query, so its blocks hold all N queries.
    b, h, hw, d = 1, 2, (6, 6), 8
    n = 1 + hw[0] * hw[1]
    q, k, v = aligned_qkv(b, h, n, d, seed=1)
    out = mita_attention(q, k, v, hw, pool_size=3, topk=5, backend='torch')
    ref = reference(q, k, v, hw, 1, 3, 5)
    torch.testing.assert_close(out, ref)


def test_float32_close_to_float64_reference():
    hw = (9, 10)
    q, k, v = random_qkv(2, 3, 1 + 90, 32)
    out = mita_attention(q.float(), k.float(), v.float(), hw, pool_size=3,
                         topk=9, backend='torch')
    ref = reference(q, k, v, hw, 1, 3, 9)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('kwargs,match', [
    (dict(hw=(5, 5)), 'hw'),
    (dict(topk=0), 'topk'),
    (dict(topk=2.5), 'topk'),
    (dict(pool_size=7), 'pool_size'),
    (dict(num_extra_tokens=-1), 'num_extra_tokens'),
    (dict(backend='cuda'), 'backend'),
])
def test_bad_arguments_name_the_parameter(kwargs, match):
    q = torch.randn(1, 2, 1 + 24, 8)
    args = dict(hw=(4, 6), num_extra_tokens=1, pool_size=2, topk=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        mita_attention(q, q, q, args.pop('hw'), **args)


def test_mismatched_shapes_are_rejected():
    q = torch.randn(1, 2, 17, 8)
    with pytest.raises(ValueError, match='same shape'):
        mita_attention(q, q[..., :4], q, (4, 4))
    with pytest.raises(ValueError, match=r'\[B, num_heads, N, head_dim\]'):
        mita_attention(q[0], q[0], q[0], (4, 4))
