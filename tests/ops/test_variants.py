"""The paper's variants of MiTA (several experts per query, routing-only,
compression-only, the authors' landmark convention) against the dense
float64 per-query reference, and against hand-written formulas."""
import pytest
import torch
import torch.nn.functional as F
from mita_testing import (aligned_qkv, assert_matches_reference, experts_of,
                          plan_of, random_qkv)

from mmseg_mita.ops import mita_attention, naive_mita, select_backend
from mmseg_mita.ops import flash_backend

SHAPES = [
    # B, heads, hw, extra, pool, topk
    (2, 3, (5, 7), 1, (2, 3), 6),
    (1, 2, (6, 5), 0, 3, 4),
    (2, 1, (4, 6), 2, 2, 1000),  # topk >= N: every expert holds every key
    (1, 2, (7, 7), 1, (3, 2), 20),  # experts overlap heavily
]
VARIANTS = [
    # experts_per_query, shared_expert, routed_experts, landmarks
    (2, True, True, 'patches'),
    (3, True, True, 'patches'),
    (1, False, True, 'patches'),
    (3, False, True, 'patches'),
    (1, True, False, 'patches'),
    (1, True, True, 'official'),
    (2, False, True, 'official'),
    (1, True, False, 'official'),
]
CASES = [shape + variant for shape in SHAPES for variant in VARIANTS
         if variant[3] == 'patches' or shape[3] == 1]


def _options(s, shared, routed, landmarks, extra=1, pool=2, topk=4):
    return dict(num_extra_tokens=extra, pool_size=pool, topk=topk,
                experts_per_query=s, shared_expert=shared,
                routed_experts=routed, landmarks=landmarks)


def _assert_matches_reference(q, k, v, hw, backend='torch', **options):
    out = mita_attention(q, k, v, hw, backend=backend, **options)
    assert_matches_reference(out, naive_mita(q, k, v, hw, **options),
                             (q, k, v))


@pytest.mark.parametrize('b,h,hw,extra,pool,topk,s,shared,routed,landmarks',
                         CASES)
def test_variant_matches_reference(b, h, hw, extra, pool, topk, s, shared,
                                   routed, landmarks):
    n = extra + hw[0] * hw[1]
    _assert_matches_reference(*random_qkv(b, h, n, 8), hw,
                              **_options(s, shared, routed, landmarks, extra,
                                         pool, topk))


@pytest.mark.parametrize('shared', [True, False])
def test_same_experts_for_every_query(shared):
    # Queries along one direction: every query of a group has the same
    # s = 2 experts, whose blocks then hold all N queries each.
    hw, d = (8, 8), 8
    n = 1 + hw[0] * hw[1]
    q, k, v = aligned_qkv(1, 2, n, d, spread=0.003)
    experts = experts_of(q, k, v, hw, 1, (3, 3), 5, experts_per_query=2)
    assert (experts.expert == experts.expert[:, :1]).all()
    _assert_matches_reference(q, k, v, hw,
                              **_options(2, shared, True, 'patches', 1, 3, 5))


def test_experts_come_best_first():
    q, k, v = random_qkv(2, 2, 26, 8)
    experts = experts_of(q, k, v, (5, 5), 1, (2, 2), 3,
                         experts_per_query=3)
    scores = experts.route_logits.gather(-1, experts.expert)
    assert experts.expert.shape == (4, 26, 3)
    assert (scores[..., :-1] > scores[..., 1:]).all()
    assert (scores[..., -1:] >= experts.route_logits.topk(3).values[..., -1:]
            ).all()


def test_routing_only_with_every_key_is_full_attention():
    # With topk >= N each expert holds every key, so a query's s * k routed
    # logits are its N full-attention logits s times over: the softmax gives
    # each copy 1 / s of the full-attention probability (a key chosen by s
    # experts appears s times), and the output is full attention's.
    hw = (5, 6)
    q, k, v = random_qkv(2, 2, 31, 8)
    full = F.scaled_dot_product_attention(q, k, v)
    for s in (1, 2, 3):
        out = mita_attention(q, k, v, hw, pool_size=2, topk=100,
                             experts_per_query=s, shared_expert=False,
                             backend='torch')
        torch.testing.assert_close(out, full, rtol=1e-10, atol=1e-10)


def _hand_pooled_official(q, hw, pool):
    """The authors' landmarks: ``q[:, :, :-1]`` laid on the grid, averaged
    over ``pool`` equal cells (``hw`` divisible by ``pool``)."""
    b, h, n, d = q.shape
    (gh, gw), (ph, pw) = hw, pool
    grid = q[:, :, :-1].reshape(b, h, ph, gh // ph, pw, gw // pw, d)
    return grid.mean(dim=(3, 5)).reshape(b * h, ph * pw, d)


def test_official_landmarks_pool_the_sequence_without_its_last_token():
    hw, pool = (6, 4), (3, 2)
    q, k, v = random_qkv(2, 3, 1 + 24, 8)
    want = _hand_pooled_official(q, hw, pool)
    got = experts_of(q, k, v, hw, 1, pool, 5, landmarks='official')
    torch.testing.assert_close(got.landmarks, want, rtol=1e-12, atol=1e-12)
    patches = experts_of(q, k, v, hw, 1, pool, 5).landmarks
    assert not torch.allclose(patches, want)

    # End to end, compression-only written out by hand with these
    # landmarks: softmax(s^2 q R^T) @ softmax(s R K^T) V.
    d = q.shape[-1]
    marks = want.view(2, 3, 6, d)
    shared_values = torch.softmax(marks @ k.transpose(-1, -2) * d**-0.5,
                                  -1) @ v
    expected = torch.softmax(q @ marks.transpose(-1, -2) / d,
                             -1) @ shared_values
    out = mita_attention(q, k, v, hw, pool_size=pool, routed_experts=False,
                         landmarks='official', backend='torch')
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_compression_only_needs_no_top_k():
    q, k, v = random_qkv(1, 2, 17, 8)
    experts = experts_of(q, k, v, (4, 4), 1, (2, 2), 3,
                         routed_experts=False)
    assert experts.expert is None and experts.topk_index is None
    assert experts.experts_per_query == 0
    experts = experts_of(q, k, v, (4, 4), 1, (2, 2), 3,
                         shared_expert=False)
    assert experts.shared_values is None


@pytest.mark.parametrize('s,shared,routed', [(1, True, True),
                                             (2, True, True),
                                             (2, False, True),
                                             (1, True, False)])
def test_dropout_gradients_are_exact_for_the_sampled_mask(s, shared, routed):
    # Reseeding gives every run the same mask: the backward must match a
    # central finite difference along a random direction.
    q, k, v = random_qkv(1, 2, 26, 8)
    options = _options(s, shared, routed, 'patches', 1, 2, 4)

    def loss(q, k, v, weight):
        torch.manual_seed(0)
        out = mita_attention(q, k, v, (5, 5), backend='torch', dropout_p=0.3,
                             **options)
        return (out * weight).sum()

    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(q.shape, generator=gen, dtype=q.dtype)
    step = [torch.randn(q.shape, generator=gen, dtype=q.dtype)
            for _ in range(3)]
    grads = torch.autograd.grad(loss(q, k, v, weight), (q, k, v))
    analytic = sum((g * u).sum() for g, u in zip(grads, step))
    eps = 1e-6
    with torch.no_grad():
        plus, minus = (loss(*(t + sign * eps * u for t, u in zip(
            (q, k, v), step)), weight) for sign in (1, -1))
    torch.testing.assert_close(analytic, (plus - minus) / (2 * eps),
                               rtol=1e-6, atol=1e-8)
    with torch.no_grad():
        kept = mita_attention(q, k, v, (5, 5), backend='torch', **options)
        torch.manual_seed(0)
        dropped = mita_attention(q, k, v, (5, 5), backend='torch',
                                 dropout_p=0.3, **options)
    assert not torch.allclose(dropped, kept)


@pytest.mark.parametrize('kwargs,match', [
    (dict(experts_per_query=5), 'experts_per_query=5 is more than the m=4'),
    (dict(experts_per_query=0), 'experts_per_query'),
    (dict(shared_expert=False, routed_experts=False),
     'shared_expert and routed_experts cannot both be False'),
    (dict(routed_experts=False, experts_per_query=2),
     'experts_per_query=2 has no effect'),
    (dict(shared_expert=1), 'shared_expert must be True or False'),
    (dict(landmarks='cls'), 'landmarks'),
    (dict(landmarks='official', num_extra_tokens=0, hw=(5, 5)),
     'exactly one extra'),
    (dict(landmarks='official', num_extra_tokens=2, hw=(1, 23),
          pool_size=(1, 2)),
     'exactly one extra'),
])
def test_bad_variant_arguments_name_the_parameter(kwargs, match):
    q = torch.randn(1, 2, 1 + 24, 8)
    args = dict(hw=(4, 6), pool_size=2, topk=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        mita_attention(q, q, q, args.pop('hw'), **args)


def test_auto_backend_takes_torch_for_several_experts(plain_flash):
    # flash first where it can run (the stand-in runs on fp16 CPU tensors),
    # the torch backend where it cannot (s = 2).
    q = torch.randn(1, 1, 17, 64, dtype=torch.float16)

    def chosen(**fields):
        return select_backend('auto', q, q, q,
                              plan_of(q, (4, 4), 1, 2, 3, **fields)).name

    assert chosen() == 'flash'
    assert chosen(experts_per_query=2) == 'torch'


@pytest.mark.parametrize('shared,routed,landmarks', [
    (False, True, 'patches'), (True, False, 'patches'),
    (True, True, 'official'), (False, True, 'official')])
def test_flash_bookkeeping_of_the_ablations(plain_flash, shared, routed,
                                            landmarks):
    hw = (5, 7)
    q, k, v = random_qkv(2, 2, 36, 8)
    options = _options(1, shared, routed, landmarks, 1, (2, 3), 6)
    experts = experts_of(q, k, v, hw, 1, (2, 3), 6,
                         shared_expert=shared, routed_experts=routed,
                         landmarks=landmarks)
    assert_matches_reference(flash_backend.attend_experts(q, k, v, experts),
                             naive_mita(q, k, v, hw, **options), (q, k, v))


def test_flash_refuses_several_experts_per_query(plain_flash):
    q, k, v = random_qkv(1, 1, 17, 8)
    with pytest.raises(ValueError, match="backend='flash' cannot compute "
                       r"this call: computes experts_per_query <= 1, got 2.*"
                       "backend='torch'"):
        mita_attention(q, k, v, (4, 4), pool_size=2, topk=3,
                       experts_per_query=2, backend='flash')
