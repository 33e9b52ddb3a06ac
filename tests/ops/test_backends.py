"""The options object and the backend registry: what each backend declares,
how ``auto`` chooses, and what a refused call says."""
import dataclasses
import importlib.util

import pytest
import torch
from mita_testing import plan_of, random_qkv, reference

from mmseg_mita.ops import (REGISTRY, MiTABackend, MiTAOptions,
                            backend_names, get_backend, mita_attention,
                            naive_mita, register_backend, select_backend)
from mmseg_mita.ops import declaration
from mmseg_mita.ops.declaration import ALL_DTYPES

NAMES = backend_names()[1:]  # every backend, 'auto' aside


def _reasons(name, d=16, dtype=torch.float32, dropout_p=0.0, grad=False,
             **fields):
    q = torch.zeros(1, 1, 5, d, dtype=dtype, requires_grad=grad)
    plan = plan_of(q, (2, 2), 1, 2, 3, dropout_p, **fields)
    return get_backend(name).not_supported_reasons(q, q, q, plan)


def test_every_backend_is_registered_and_accepted_by_name():
    assert backend_names() == ('auto', 'export', 'flash', 'torch', 'triton')
    for name in NAMES:
        assert get_backend(name).name == name and name in REGISTRY
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', "
                       r"'export', 'flash', 'torch', 'triton'\), got 'fast'"):
        get_backend('fast')


def test_triton_is_collected_on_first_use_only(monkeypatch):
    # Importing the operator loads no triton (test_package_imports.py):
    # the registry imports the Triton backend's module when it is asked
    # for, and names the missing package when it cannot.
    monkeypatch.delitem(REGISTRY, 'triton', raising=False)
    monkeypatch.setitem(declaration._AVAILABLE, 'triton', False)
    q = torch.randn(1, 1, 17, 16)
    for call in (lambda: get_backend('triton'),
                 lambda: mita_attention(q, q, q, (4, 4), pool_size=2, topk=3,
                                        backend='triton')):
        with pytest.raises(ValueError, match="backend='triton' cannot "
                           'compute this call: needs the module triton: '
                           "`pip install triton`.*Use backend='torch'"):
            call()
    assert 'triton' not in REGISTRY and 'triton' in backend_names()
    if importlib.util.find_spec('triton') is None:
        return
    monkeypatch.setitem(declaration._AVAILABLE, 'triton', True)
    assert get_backend('triton') is REGISTRY['triton']
    assert REGISTRY['triton'].max_head_dim == 128


def test_options_are_validated_once_with_the_field_named():
    options = MiTAOptions(pool_size=3, topk=9)
    assert options.pool_size == (3, 3) and options.num_landmarks == 9
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.topk = 4
    with pytest.raises(ValueError, match='topk must be an int >= 1'):
        MiTAOptions(topk=0)
    with pytest.raises(ValueError, match='mita_cfg.experts_per_query=10 is '
                       'more than the m=9'):
        MiTAOptions.from_dict(dict(pool_size=3, experts_per_query=10),
                              prefix='mita_cfg.')
    with pytest.raises(ValueError, match='unknown MiTA option x.pool'):
        MiTAOptions.from_dict(dict(pool=3), prefix='x.')
    with pytest.raises(ValueError, match='unknown MiTA option x.prefix'):
        MiTAOptions.from_dict(dict(prefix='y.'), prefix='x.')
    # the prefix names the fields in messages only: it is not a field
    assert MiTAOptions.from_dict(dict(topk=9), prefix='x.') == \
        MiTAOptions(topk=9)
    assert 'prefix' not in dataclasses.asdict(options)


def test_options_are_checked_once_per_construction(monkeypatch):
    from mmseg_mita.ops import options as options_module
    calls = []
    checked = options_module._checked

    def counted(*args):
        calls.append(args[1])
        return checked(*args)

    monkeypatch.setattr(options_module, '_checked', counted)
    MiTAOptions.from_dict(dict(pool_size=3, topk=9), prefix='mita_cfg.')
    MiTAOptions(pool_size=2)
    assert calls == ['mita_cfg.', '']


def test_options_or_keywords_not_both():
    q, k, v = random_qkv(1, 1, 10, 4)
    with pytest.raises(ValueError, match='either options or the option '
                       r"keywords \['topk'\]"):
        mita_attention(q, k, v, (3, 3), options=MiTAOptions(pool_size=2),
                       topk=3)
    with pytest.raises(ValueError, match='unknown MiTA option'):
        mita_attention(q, k, v, (3, 3), pool=2)
    out = mita_attention(q, k, v, (3, 3),
                         options=MiTAOptions(pool_size=2, topk=3))
    torch.testing.assert_close(out, reference(q, k, v, (3, 3), 1, 2, 3))


def test_an_explicit_backend_that_cannot_run_lists_every_reason():
    q = torch.randn(1, 1, 17, 136, dtype=torch.float64)
    with pytest.raises(ValueError) as info:
        mita_attention(q, q, q, (4, 4), pool_size=2, topk=3,
                       experts_per_query=2, backend='triton',
                       dropout_p=0.1)
    message = str(info.value)
    for reason in ('computes in float32/float16/bfloat16, got torch.float64',
                   'supports head_dim <= 128, got 136',
                   'computes experts_per_query <= 1, got 2',
                   'does not implement attention dropout (dropout_p=0.1)',
                   "Use backend='torch'"):
        assert reason in message, message


@pytest.mark.parametrize('name', NAMES)
def test_declared_head_dim_limits_hold_at_their_boundary(name):
    backend = get_backend(name)
    step = backend.head_dim_multiple
    dtype = torch.float16 if torch.float16 in backend.dtypes else \
        backend.dtypes[0]
    limit = backend.max_head_dim or 1024

    def head_dim_reasons(d):
        return [r for r in _reasons(name, d=d, dtype=dtype)
                if 'head_dim' in r]

    assert head_dim_reasons(limit) == []
    if backend.max_head_dim is not None:
        assert head_dim_reasons(limit + step) == [
            f'supports head_dim <= {limit}, got {limit + step}']
    if step > 1:
        assert head_dim_reasons(step + 1) == [
            f'needs head_dim a multiple of {step}, got {step + 1}']


@pytest.mark.parametrize('name', NAMES)
def test_declared_dtypes_and_variants_hold(name):
    backend = get_backend(name)
    for dtype in ALL_DTYPES:
        refused = any('computes in' in r
                      for r in _reasons(name, d=16, dtype=dtype))
        assert refused == (dtype not in backend.dtypes)
    s_limit = backend.max_experts_per_query
    if s_limit is not None:
        assert not any('experts_per_query' in r
                       for r in _reasons(name, experts_per_query=s_limit))
        assert any(f'experts_per_query <= {s_limit}, got {s_limit + 1}' in r
                   for r in _reasons(name, experts_per_query=s_limit + 1))
    for fields in (dict(shared_expert=False), dict(routed_experts=False)):
        refused = any('both experts' in r for r in _reasons(name, **fields))
        assert refused == (not backend.ablations)
    refused = any("got 'official'" in r
                  for r in _reasons(name, landmarks='official'))
    assert refused == ('official' not in backend.landmarks)
    refused = any('dropout' in r for r in _reasons(name, dropout_p=0.1))
    assert refused == (not backend.dropout)


def test_export_is_inference_only():
    assert any('forward only' in r for r in _reasons('export', grad=True))
    with torch.no_grad():
        assert not any('forward only' in r
                       for r in _reasons('export', grad=True))


def test_auto_takes_the_torch_backend_on_cpu():
    q = torch.randn(1, 1, 10, 8)
    assert select_backend('auto', q, q, q, plan_of(q, (3, 3), 1, 2,
                                                   3)).name == 'torch'


def test_auto_that_finds_no_backend_lists_every_candidates_reasons():
    q = torch.zeros(1, 1, 10, 8, dtype=torch.int32)
    with pytest.raises(ValueError) as info:
        mita_attention(q, q, q, (3, 3), pool_size=2, topk=3)
    message = str(info.value)
    assert message.startswith("backend='auto' found no backend that can "
                              "compute this call: 'flash': ")
    for reason in ("'torch': computes in float16/bfloat16/float32/float64, "
                   'got torch.int32',
                   'computes in float16/bfloat16, got torch.int32',
                   'computes on cuda, got cpu tensors'):
        assert reason in message, message


def test_the_plan_holds_the_call_resolved(monkeypatch):
    q = torch.zeros(2, 3, 1 + 20, 24)
    plan = plan_of(q, (4, 5), 1, (2, 3), 500, 0.25, landmarks='official')
    assert (plan.hw, plan.num_tokens, plan.head_dim, plan.pool_size,
            plan.num_landmarks, plan.first_pooled, plan.topk,
            plan.dropout_p) == ((4, 5), 21, 24, (2, 3), 6, 0, 21, 0.25)
    assert plan.scale == 24**-0.5
    assert plan_of(q, (4, 5), 1, 2, 7).topk == 7
    assert plan_of(q, (4, 5), 1, 2, 7).first_pooled == 1
    seen = []
    monkeypatch.setitem(REGISTRY, 'torch',
                        dataclasses.replace(REGISTRY['torch'],
                                            run=lambda *args: seen.append(
                                                args[3]) or args[0]))
    mita_attention(q, q, q, (4, 5), pool_size=(2, 3), topk=500,
                   landmarks='official', backend='torch')
    assert seen == [dataclasses.replace(plan, dropout_p=0.0)]  # one plan


def test_a_registered_backend_can_compute_everything_itself(monkeypatch):
    calls = []

    def run(q, k, v, plan):
        calls.append(plan)
        return naive_mita(q, k, v, plan.hw,
                          num_extra_tokens=plan.num_extra_tokens,
                          pool_size=plan.pool_size, topk=plan.topk)

    monkeypatch.delitem(REGISTRY, 'plain', raising=False)
    register_backend(MiTABackend('plain', run, dropout=False))
    try:
        q, k, v = random_qkv(1, 2, 10, 4)
        out = mita_attention(q, k, v, (3, 3), pool_size=2, topk=3,
                             backend='plain')
        torch.testing.assert_close(out, reference(q, k, v, (3, 3), 1, 2, 3))
        assert calls == [plan_of(q, (3, 3), 1, 2, 3)]
        with pytest.raises(ValueError, match='exists'):
            register_backend(MiTABackend('plain', run))
    finally:
        del REGISTRY['plain']
