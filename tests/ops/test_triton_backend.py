"""The Triton backend on CPU through Triton's interpreter, against the dense
float64 per-query reference (forward and gradients of q, k and v).

``TRITON_INTERPRET=1`` is set by ``conftest.py`` of this directory when
there is no GPU (before triton is first imported); with a GPU these tests
skip and ``test_cuda_backends.py`` runs the compiled kernels. The
interpreter has no float64 ``tl.dot``: float32 inputs are checked against the
float64 reference on the same values at a tight tolerance. Block sizes are
16 in the interpreter, so the cases below span several key tiles
(m, k > 16), several query tiles and chunks per expert, a padded head_dim
and, at N = 82, one expert holding every query.
"""
import pytest
import torch
from low_precision import assert_as_accurate_as_torch, relative_error
from mita_testing import aligned_qkv, experts_of, random_qkv

from mmseg_mita.ops import mita_attention
from mmseg_mita.ops.routing import sort_by_expert

pytest.importorskip('triton',
                    reason='triton is a test dependency: pip install triton')
from mmseg_mita.ops import triton_backend  # noqa: E402

from mita_testing import reference as reference_mita  # noqa: E402

pytestmark = [
    pytest.mark.skipif(
        not triton_backend.interpreted(),
        reason='the kernels are compiled (a GPU is present, or triton was '
        'imported before TRITON_INTERPRET=1 was set): CUDA runs are in '
        'tests/ops/test_cuda_backends.py'),
    # The interpreter's own loop bounds (triton 3.6, numpy 1.25 to 2.3).
    pytest.mark.filterwarnings(
        'ignore:Conversion of an array with ndim > 0:DeprecationWarning'),
]


def _run(q, k, v, hw, extra, pool, topk, backend, dtype):
    """Output and input gradients of ``backend`` on ``dtype`` copies."""
    low = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = mita_attention(*low, hw, num_extra_tokens=extra, pool_size=pool,
                         topk=topk, backend=backend)
    return out, low


def _reference(q, k, v, hw, extra, pool, topk, grad):
    ref = reference_mita(q, k, v, hw, extra, pool, topk)
    return ref.detach(), torch.autograd.grad(ref, (q, k, v), grad)


@pytest.mark.parametrize('b,h,hw,extra,pool,topk,d', [
    (2, 3, (7, 11), 1, 3, 5, 16),     # batch > 1, heads, odd grid
    (1, 2, (5, 5), 0, 2, 4, 16),      # no extra token
    (3, 2, (8, 5), 2, (3, 2), 6, 16),  # 2 extra tokens, uneven pooling
    (1, 2, (4, 6), 1, 4, 1000, 16),   # topk >= N: every key
    (1, 2, (9, 10), 1, 5, 20, 24),    # m = 25, k = 20 > 16: 2 key tiles;
                                      # head_dim 24 padded to 32
])
def test_float32_matches_reference(b, h, hw, extra, pool, topk, d):
    n = extra + hw[0] * hw[1]
    q, k, v = random_qkv(b, h, n, d)
    q, k, v = (t.detach().float().double().requires_grad_()
               for t in (q, k, v))
    grad = torch.randn(q.shape, dtype=torch.float64)
    ref, ref_grads = _reference(q, k, v, hw, extra, pool, topk, grad)
    out, low = _run(q, k, v, hw, extra, pool, topk, 'triton', torch.float32)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(out, low, grad.float())
    for name, got, want in zip('qkv', grads, ref_grads):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f'grad of {name}: {m}')


def test_one_expert_gets_every_query():
    # 82 queries along one landmark direction: all in one expert, so it
    # spans 6 query tiles of 16 and 3 backward chunks of 32.
    hw, d = (9, 9), 16
    n = 1 + hw[0] * hw[1]
    q, k, v = (t.detach().float().double().requires_grad_()
               for t in aligned_qkv(1, 2, n, d))
    experts = experts_of(q, k, v, hw, 1, (3, 3), 5)
    assert (experts.expert == experts.expert[:, :1]).all()
    grad = torch.randn(q.shape, dtype=torch.float64)
    ref, ref_grads = _reference(q, k, v, hw, 1, 3, 5, grad)
    out, low = _run(q, k, v, hw, 1, 3, 5, 'triton', torch.float32)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(out, low, grad.float())
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_half_precision_within_twice_the_torch_backend_error(dtype):
    # Routing held fixed (low_precision.py): the error is the numerical
    # error of the attention alone; the Triton kernels must be about as
    # accurate as the torch backend (measured: 0.6x to 1.5x its error).
    inputs = [t.detach().to(dtype).double() for t in random_qkv(1, 2, 101, 64)]
    assert_as_accurate_as_torch(triton_backend.mita_triton, inputs, (10, 10),
                                1, (3, 3), 20, dtype, 'cpu',
                                bounds=(2e-2, 2e-2))


def test_autocast_computes_in_the_autocast_dtype():
    hw = (6, 7)
    q, k, v = (t.detach().float().requires_grad_()
               for t in random_qkv(2, 2, 1 + 42, 16))
    results = {}
    for backend in ('torch', 'triton'):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = mita_attention(q, k, v, hw, pool_size=2, topk=6,
                                 backend=backend)
        grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
        results[backend] = (out, grads)
    out, grads = results['triton']
    assert out.dtype == torch.bfloat16
    want_out, want_grads = results['torch']
    assert relative_error(out, want_out.double()) < 1e-2
    for got, want in zip(grads, want_grads):
        assert got.dtype == torch.float32
        assert relative_error(got, want.double()) < 2e-2


def test_tiles_never_straddle_experts_and_skip_empty_ones():
    counts = torch.tensor([3, 0, 5, 0, 0, 17, 1, 0])
    block = 4
    bound = triton_backend.max_tiles(int(counts.sum()), counts.numel(),
                                     block)
    tiles = triton_backend.expert_tiles(counts, block, bound)
    assert tiles.shape == (3, bound) and tiles.dtype == torch.int32
    expert, start, end = tiles.long()
    used = end > start
    # Tiles per expert: ceil(count / block); none for the empty experts.
    assert expert[used].tolist() == [0, 2, 2, 5, 5, 5, 5, 5, 6]
    # Every sorted query in exactly one tile, inside its expert's range.
    first = torch.cumsum(counts, 0) - counts
    covered = torch.zeros(int(counts.sum()), dtype=torch.long)
    for e, s, t in zip(expert[used], start[used], end[used]):
        assert t - s <= block
        assert first[e] <= s and t <= first[e] + counts[e]
        covered[s:t] += 1
    assert (covered == 1).all()
    # The surplus of the upper bound is empty tiles.
    assert (start[~used] == 0).all() and (end[~used] == 0).all()


def test_tile_bound_holds_for_routed_queries():
    gen = torch.Generator().manual_seed(0)
    for block in (16, 32, 64):
        for _ in range(20):
            g, n, m = 3, int(torch.randint(1, 300, (1, ), generator=gen)), 49
            expert = torch.randint(0, m, (g, n), generator=gen)
            expert[0] = 7  # one group: all queries in one expert
            counts = sort_by_expert(expert, m).counts
            needed = int(((counts + block - 1) // block).sum())
            assert needed <= triton_backend.max_tiles(g * n, g * m, block)


@pytest.mark.parametrize('kwargs,dtype,d,match', [
    (dict(dropout_p=0.1), torch.float32, 16, 'dropout_p'),
    ({}, torch.float32, 136, 'head_dim'),
    ({}, torch.float64, 16, 'float64'),
])
def test_unsupported_inputs_name_the_fix(kwargs, dtype, d, match):
    q = torch.randn(1, 1, 17, d, dtype=dtype)
    with pytest.raises(ValueError, match=match) as info:
        mita_attention(q, q, q, (4, 4), pool_size=2, topk=3,
                       backend='triton', **kwargs)
    assert "backend='torch'" in str(info.value)


def test_cpu_tensors_without_the_interpreter_name_the_fix(monkeypatch):
    monkeypatch.setattr(triton_backend, 'interpreted', lambda: False)
    q = torch.randn(1, 1, 17, 16)
    with pytest.raises(ValueError, match='TRITON_INTERPRET=1'):
        mita_attention(q, q, q, (4, 4), pool_size=2, topk=3,
                       backend='triton')


def test_missing_triton_names_the_fix(monkeypatch):
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, 'find_spec',
        lambda name, *a: None if name == 'triton' else find_spec(name, *a))
    q = torch.randn(1, 1, 17, 16)
    with pytest.raises(ValueError, match='needs triton'):
        mita_attention(q, q, q, (4, 4), pool_size=2, topk=3,
                       backend='triton')
