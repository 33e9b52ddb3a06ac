"""The comparison helpers catch what they claim. The low-precision helper
(``low_precision.py``) fails a backend a little off in its output or one
gradient through its ratio to the torch backend alone, an inaccurate
backend or baseline through its absolute bounds; holding the routing fixed
is what lets a correct backend pass on an input where bf16 flips a routing
decision. The float64 comparison (``mita_testing.py``) checks each
gradient."""
import pytest
import torch
from low_precision import (assert_as_accurate_as_torch, fixed_routing_errors,
                           relative_error)
from mita_testing import (ScaleGrad, assert_matches_reference, experts_of,
                          random_qkv)

from mmseg_mita.ops.torch_backend import attend_experts as attend

# The Triton test's case (no routing decision flips in bf16 or fp16 here).
HW, EXTRA, POOL, TOPK = (10, 10), 1, (3, 3), 20
NO_BOUNDS = (1.0, 1.0)  # only the ratio to the torch backend can fail


def _inputs(dtype, d=64, seed=0):
    """float64 q, k, v [1, 2, 101, d], rounded to ``dtype``."""
    n = EXTRA + HW[0] * HW[1]
    return [t.detach().to(dtype).double()
            for t in random_qkv(1, 2, n, d, seed=seed)]


def _check(backend_fn, dtype, **kwargs):
    return assert_as_accurate_as_torch(backend_fn, _inputs(dtype), HW, EXTRA,
                                       POOL, TOPK, dtype, 'cpu', **kwargs)


def _output_off(scale):
    """The torch backend with its output (and so every gradient) scaled."""
    return lambda q, k, v, experts: attend(q, k, v, experts) * scale


def _dq_off(scale):
    """The torch backend with the q gradient of its attention scaled (the
    part through the routing logits, computed outside it, is not)."""
    return lambda q, k, v, experts: attend(ScaleGrad.apply(q, scale), k, v,
                                           experts)


DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize('dtype', DTYPES)
def test_the_torch_backend_passes(dtype):
    errors = _check(attend, dtype, bounds=(2e-2, 2e-2))
    # measured: bf16 0.4 % .. 0.5 %, fp16 ten times less
    assert max(errors['backend']) < (1e-2 if dtype == torch.bfloat16 else
                                     1e-3)


@pytest.mark.parametrize('dtype', DTYPES)
def test_output_1_5_percent_off_fails_on_the_ratio_alone(dtype):
    # The torch backend is 0.36 % (bf16) / 0.044 % (fp16) off: 1.5 % is 4x
    # and 34x that, so a factor 20 passes it in bf16, not in fp16.
    with pytest.raises(AssertionError, match='out: relative error'):
        _check(_output_off(1.015), dtype, bounds=NO_BOUNDS)


@pytest.mark.parametrize('dtype', DTYPES)
def test_dq_off_fails_on_the_ratio_alone(dtype):
    errors = fixed_routing_errors({'off': _dq_off(1.08)}, _inputs(dtype), HW,
                                  EXTRA, POOL, TOPK, dtype, 'cpu')['off']
    # dq 8 % off (measured), the rest as accurate as the torch backend
    assert errors[1] > 0.06 and max(errors[0], *errors[2:]) < 0.01, errors
    with pytest.raises(AssertionError, match='dq: relative error'):
        _check(_dq_off(1.08), dtype, bounds=NO_BOUNDS)


@pytest.mark.parametrize('side', ['backend', 'baseline'])
@pytest.mark.parametrize('which', ['out', 'dq'])
def test_absolute_bounds_catch_an_inaccurate_side(side, which):
    # 3 % off, the other side correct, the ratio check out of the way
    # (factor 100): only the absolute bounds (2e-2) can fail, on either
    # side. An inaccurate baseline would otherwise widen what passes.
    off = (_output_off if which == 'out' else _dq_off)(1.03)
    fns = dict(backend_fn=attend, baseline_fn=attend)
    fns[f'{side}_fn'] = off
    errors = fixed_routing_errors({'off': off}, _inputs(torch.bfloat16), HW,
                                  EXTRA, POOL, TOPK, torch.bfloat16,
                                  'cpu')['off']
    assert 0.025 < errors[('out', 'dq').index(which)] < 0.05, errors
    with pytest.raises(AssertionError):
        _check(fns.pop('backend_fn'), torch.bfloat16, factor=100.0,
               bounds=(2e-2, 2e-2), **fns)


def test_held_routing_lets_a_correct_backend_pass_where_bf16_flips_one():
    # d = 16, seed 2: bf16 routes queries to other experts than float64
    # does; each such query then sees other keys.
    dtype, hw, pool, topk = torch.bfloat16, HW, POOL, TOPK
    inputs = _inputs(dtype, d=16, seed=2)
    want = experts_of(*inputs, hw, EXTRA, pool, topk)
    low = [t.to(dtype) for t in inputs]
    own = experts_of(*low, hw, EXTRA, pool, topk)
    flipped_experts = int((own.expert != want.expert).sum())
    flipped_keys = int((own.topk_index.sort(-1).values !=
                        want.topk_index.sort(-1).values).any(-1).sum())
    assert flipped_experts + flipped_keys > 0
    # Routed by itself, the torch backend fails the helper's bound ...
    unfixed = relative_error(attend(*low, own), attend(*inputs, want))
    assert unfixed > 5e-2
    # ... held to float64's routing it is as accurate as elsewhere.
    errors = assert_as_accurate_as_torch(attend, inputs, hw, EXTRA, pool,
                                         topk, dtype, 'cpu',
                                         bounds=(2e-2, 2e-2))
    assert max(errors['torch']) < 1e-2


@pytest.mark.parametrize('name', ['q', 'k', 'v'])
def test_float64_comparison_checks_each_gradient(name):
    # assert_matches_reference (mita_testing.py), the float64 comparison of
    # every backend test: a gradient 1e-6 off fails it, in q, k or v.
    inputs = random_qkv(1, 2, 26, 8)

    def mita(scale=1.0, which=None):
        qkv = [ScaleGrad.apply(t, scale) if n == which else t
               for n, t in zip('qkv', inputs)]
        return attend(*qkv, experts_of(*qkv, (5, 5), 1, 2, 4))

    with pytest.raises(AssertionError, match=f'grad of {name}'):
        assert_matches_reference(mita(1 + 1e-6, name), mita(), inputs)
    with pytest.raises(AssertionError):
        assert_matches_reference(mita() * (1 + 1e-8), mita(), inputs)
    assert_matches_reference(mita(), mita(), inputs)
