"""The fused Triton pipeline on CPU through Triton's interpreter, against the
dense float64 per-query reference (forward and gradients of q, k and v).

``TRITON_INTERPRET=1`` is set by ``conftest.py`` of this directory when
there is no GPU (before triton is first imported); with a GPU these tests
skip and ``test_cuda_backends.py`` runs the compiled kernels. The
interpreter has no float64 ``tl.dot``: float32 inputs are checked against the
float64 reference on the same values at a tight tolerance. Blocks are 16
queries / keys / landmarks in the interpreter, so the cases below span
several key tiles (m, k > 16), several blocks per expert, a padded head_dim
and, at N = 82, one expert holding every query.
"""
import pytest
import torch
from low_precision import (assert_as_accurate_as_torch, relative_error,
                           triton_with_routing)
from mita_testing import aligned_qkv, experts_of, plan_of, random_qkv
from torch.utils._python_dispatch import TorchDispatchMode

from mmseg_mita.ops import REGISTRY, mita_attention, naive_mita
from mmseg_mita.ops.torch_backend import attend_experts

pytest.importorskip(
    'triton', reason='triton is a test dependency: pip install triton')
from mmseg_mita.ops import triton_backend  # noqa: E402

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
BLOCK = 16  # queries per block in the interpreter (_Config)


def _leaves(inputs, dtype=torch.float32):
    """float64 leaves rounded to ``dtype``, and ``dtype`` leaves."""
    ref = [t.detach().to(dtype).double().requires_grad_() for t in inputs]
    return ref, [t.detach().to(dtype).requires_grad_() for t in ref]


def _assert_close(out, ref, low, ref_leaves):
    """Output at 1e-5, gradients of q, k, v at 1e-4, one upstream grad."""
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    grad = torch.randn(ref.shape, dtype=torch.float64)
    got = torch.autograd.grad(out, low, grad.to(out.dtype))
    want = torch.autograd.grad(ref, ref_leaves, grad)
    for name, g1, g2 in zip('qkv', got, want):
        torch.testing.assert_close(
            g1.double(),
            g2,
            rtol=1e-4,
            atol=1e-4,
            msg=lambda m: f'grad of {name}: {m}')


@pytest.mark.parametrize(
    'b,h,hw,extra,pool,topk,d,landmarks',
    [
        (2, 2, (7, 11), 1, (3, 3), 5, 16, 'patches'),  # batch, heads, odd grid
        (1, 2, (5, 5), 0, (2, 2), 4, 16, 'patches'),  # no extra token
        (1, 2, (8, 5), 2, (3, 2), 6, 16, 'patches'),  # 2 extra, bins overlap
        (1, 1, (4, 6), 1, (4, 4), 1000, 16, 'patches'),  # topk >= N
        (1, 1, (9, 10), 1, (5, 5), 20, 24, 'patches'),  # m = 25, k = 20 > 16;
        # head_dim 24 padded
        (1, 2, (5, 6), 1, (2, 3), 7, 16, 'official'),
    ])
def test_float32_matches_reference(b, h, hw, extra, pool, topk, d, landmarks):
    n = extra + hw[0] * hw[1]
    ref_leaves, low = _leaves(random_qkv(b, h, n, d))
    ref = naive_mita(
        *ref_leaves,
        hw,
        num_extra_tokens=extra,
        pool_size=pool,
        topk=topk,
        landmarks=landmarks)
    out = triton_backend.mita_triton(
        *low, plan_of(low[0], hw, extra, pool, topk, landmarks=landmarks))
    assert out.shape == low[0].shape and out.dtype == torch.float32
    _assert_close(out, ref, low, ref_leaves)


def test_strided_qkv_views_are_read_in_place():
    # [B, H, N, d] views of one qkv projection, as the ViT layer makes them.
    hw, extra, d = (5, 7), 1, 16
    n = extra + hw[0] * hw[1]
    qkv = torch.randn(2, n, 3 * 2 * d, dtype=torch.float64)
    ref_qkv = qkv.float().double().requires_grad_()
    low_qkv = ref_qkv.detach().float().requires_grad_()
    views = [
        t.view(2, n, 3, 2, d).permute(2, 0, 3, 1, 4)
        for t in (ref_qkv, low_qkv)
    ]
    ref = naive_mita(
        *views[0], hw, num_extra_tokens=extra, pool_size=(2, 3), topk=9)
    out = triton_backend.mita_triton(
        *views[1], plan_of(views[1][0], hw, extra, (2, 3), 9))
    _assert_close(out, ref, [low_qkv], [ref_qkv])


def test_one_expert_gets_every_query():
    # 82 queries along one landmark direction: all in one expert, spanning
    # 6 blocks of 16; the other 8 experts get none.
    hw, d = (9, 9), 16
    n = 1 + hw[0] * hw[1]
    ref_leaves, low = _leaves(aligned_qkv(1, 2, n, d))
    experts = experts_of(*ref_leaves, hw, 1, (3, 3), 5)
    assert (experts.expert == experts.expert[:, :1]).all()
    ref = naive_mita(*ref_leaves, hw, pool_size=3, topk=5)
    out = triton_backend.mita_triton(*low, plan_of(low[0], hw, 1, 3, 5))
    _assert_close(out, ref, low, ref_leaves)


def _expert_ids(g, n, m, seed=0):
    """Random expert ids [G, N] with, in group 0, exactly BLOCK + 1 queries
    in expert 2 and none in experts 0 and 5."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, m, (g, n), generator=gen)
    others = torch.tensor([e for e in range(m) if e not in (0, 2, 5)])
    ids[0] = others[torch.randint(0, len(others), (n, ), generator=gen)]
    ids[0, torch.randperm(n, generator=gen)[:BLOCK + 1]] = 2
    return ids


def test_expert_with_one_query_more_than_a_block():
    # Routing held fixed: expert 2 of group 0 gets BLOCK + 1 queries (two
    # blocks, the second with one query), experts 0 and 5 none. Against the
    # torch backend in float64 on the same routing.
    hw, pool, d = (6, 7), (2, 3), 16
    n = 1 + hw[0] * hw[1]
    ref_leaves, low = _leaves(random_qkv(1, 2, n, d))
    ids = _expert_ids(2, n, 6)
    experts = experts_of(*ref_leaves, hw, 1, pool, 8)
    experts = experts._replace(expert=ids[..., None])
    ref = attend_experts(*ref_leaves, experts)
    out = triton_backend.mita_triton_routed(
        *low, plan_of(low[0], hw, 1, pool, 8), ids, experts.topk_index)
    _assert_close(out, ref, low, ref_leaves)


def test_counting_sort_matches_a_plain_reference():
    g, n, m, d = 2, 45, 6, 16
    # Small integers: every score exact in float32, ties included.
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-3, 4, (1, g, n, d), generator=gen).float()
    marks = torch.randint(-3, 4, (g, m, d), generator=gen).float()
    cfg = triton_backend._Config(n, m, d, torch.float32, True)
    assert cfg.block == BLOCK
    ids = _expert_ids(g, n, m)
    got_ids, slots, block_expert = triton_backend.route_and_sort(
        q, marks, cfg, ids)
    assert (got_ids == ids).all()
    assert slots.shape == (g, BLOCK * (n // BLOCK + m))
    assert block_expert.shape == (g, n // BLOCK + m)
    for group in range(g):
        counts = torch.bincount(ids[group], minlength=m)
        blocks = (counts + BLOCK - 1) // BLOCK
        first = torch.cumsum(blocks, 0) - blocks
        want_expert = torch.full((block_expert.shape[1], ), -1)
        want_slots = torch.full((slots.shape[1], ), -1)
        for e in range(m):  # experts without a query get no block
            want_expert[first[e]:first[e] + blocks[e]] = e
            queries = (ids[group] == e).nonzero().flatten()  # stable order
            start = int(first[e]) * BLOCK
            want_slots[start:start + len(queries)] = queries
        assert block_expert[group].tolist() == want_expert.tolist()
        assert slots[group].tolist() == want_slots.tolist()
    assert block_expert[0, :3].tolist() == [1, 2, 2]  # BLOCK + 1: 2 blocks

    # Routing in the kernel: the argmax of q . R, first index on ties, and
    # never a padding expert (m = 6 of 16), even where every score is < 0.
    marks[1, 4] = marks[1, 1]  # a tie between experts 1 and 4
    marks[0] = marks[0].abs() + 1
    q[0, 0, :5] = -q[0, 0, :5].abs() - 1
    routed, _, _ = triton_backend.route_and_sort(q, marks, cfg)
    scores = q[0].double() @ marks.double().transpose(1, 2)
    assert (routed == scores.argmax(-1)).all()


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_half_precision_within_twice_the_torch_backend_error(dtype):
    # Routing held fixed (low_precision.py): the error is the numerical
    # error of the attention alone.
    hw, pool = (10, 10), (3, 3)
    inputs = [t.detach().to(dtype).double() for t in random_qkv(1, 2, 101, 64)]
    assert_as_accurate_as_torch(
        triton_with_routing(hw, 1, pool),
        inputs,
        hw,
        1,
        pool,
        20,
        dtype,
        'cpu',
        bounds=(2e-2, 2e-2))


def test_autocast_computes_in_the_autocast_dtype():
    # Under bf16 autocast: exactly the call on bf16 copies, gradients
    # back to the float32 leaves; and close to the torch backend under
    # autocast given the same routing (torch rounds R K^T and q R^T to bf16
    # before its top-k and argmax, which creates ties of its own).
    hw = (5, 6)
    q, k, v = (
        t.detach().float().requires_grad_()
        for t in random_qkv(2, 1, 1 + 30, 16))
    grad = torch.randn(q.shape)
    plan = plan_of(q, hw, 1, 2, 6)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = triton_backend.mita_triton(q, k, v, plan)
    grads = torch.autograd.grad(out, (q, k, v), grad.bfloat16())
    low = [t.detach().bfloat16().requires_grad_() for t in (q, k, v)]
    want = triton_backend.mita_triton(*low, plan)
    want_grads = torch.autograd.grad(want, low, grad.bfloat16())
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, want)
    routing = triton_backend.mita_triton_fwd(*low, *hw, 1, 2, 2, 6, None, None)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        experts = experts_of(q, k, v, hw, 1, (2, 2), 6)._replace(
            expert=routing[6].long()[..., None], topk_index=routing[5])
        torch_out = attend_experts(q, k, v, experts)
    assert relative_error(out, torch_out) < 1e-2
    for got, expected in zip(grads, want_grads):
        assert got.dtype == torch.float32
        assert torch.equal(got, expected.float())


def _call(q, k, v):
    return triton_backend.mita_triton(q, k, v, plan_of(q, (4, 5), 1, 2, 6))


@pytest.mark.parametrize('backend', ['aot_eager', 'inductor'])
def test_compiled_in_one_graph_matches_eager(backend):
    # fullgraph: the custom ops (forward, backward) leave no graph break.
    inputs = [t.detach().float() for t in random_qkv(1, 2, 21, 16)]
    results = []
    for fn in (_call, torch.compile(_call, fullgraph=True, backend=backend)):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = fn(*leaves)
        results.append([out] +
                       list(torch.autograd.grad(out.square().sum(), leaves)))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_collected_on_first_use_inside_a_compiled_call(monkeypatch):
    # The registry collects the Triton backend when it is first asked for,
    # also when that call is traced by torch.compile(fullgraph=True).
    monkeypatch.delitem(REGISTRY, 'triton', raising=False)

    def through_the_operator(q, k, v):
        return mita_attention(q, k, v, (4, 5), pool_size=2, topk=6,
                              backend='triton')

    inputs = [t.detach().float() for t in random_qkv(1, 2, 21, 16)]
    got = torch.compile(through_the_operator, fullgraph=True,
                        backend='aot_eager')(*inputs)
    assert REGISTRY['triton'] is triton_backend.BACKEND
    torch.testing.assert_close(got, _call(*inputs), rtol=0, atol=0)


def test_custom_op_registrations_pass_opcheck():
    # Schema, fake implementation (shapes from the inputs only, dynamic
    # shapes too) and autograd registration of the forward op.
    q, k, v = (
        t.detach().float().requires_grad_() for t in random_qkv(1, 2, 21, 16))
    results = torch.library.opcheck(
        triton_backend.mita_triton_fwd,
        (q, k, v, 4, 5, 1, 2, 2, 6, None, None),
        test_utils=('test_schema', 'test_faketensor',
                    'test_autograd_registration', 'test_aot_dispatch_dynamic'))
    assert set(results.values()) == {'SUCCESS'}, results


class _NoHostSync(TorchDispatchMode):
    """Fails on an op that reads a device value on the host."""
    SYNCS = ('aten::_local_scalar_dense', 'aten::nonzero', 'aten::item')

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        assert func._schema.name not in self.SYNCS, func
        return func(*args, **(kwargs or {}))


def test_no_host_synchronisation(monkeypatch):
    # A dispatch mode does not see the ops inside a custom op: the
    # implementations run under it too.
    mode = _NoHostSync()

    def under_mode(fn):

        def run(*args):
            with mode:
                return fn(*args)

        return run

    for name in ('_forward', '_backward'):
        monkeypatch.setattr(triton_backend, name,
                            under_mode(getattr(triton_backend, name)))
    q, k, v = (
        t.detach().float().requires_grad_() for t in random_qkv(1, 2, 21, 16))
    with mode:
        out = _call(q, k, v)
        torch.autograd.grad(out.sum(), (q, k, v))
    with pytest.raises(AssertionError, match='nonzero'), mode:
        _call(q, k, v).nonzero()


def test_head_dim_128_runs_and_float32_dots_are_ieee():
    ref_leaves, low = _leaves(random_qkv(1, 1, 17, 128))
    ref = naive_mita(*ref_leaves, (4, 4), pool_size=2, topk=3)
    out = mita_attention(*low, (4, 4), pool_size=2, topk=3,
                         backend='triton')
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    # The interpreter computes every dot exactly: only the launch settings
    # show a float32 call on tensor-core tf32.
    for interpreted in (True, False):
        cfg = triton_backend._Config(4097, 49, 64, torch.float32, interpreted)
        assert cfg.precision == 'ieee'


@pytest.mark.parametrize('dtype,d,dropout_p,match', [
    (torch.float32, 16, 0.1, r'attention dropout \(dropout_p=0.1\)'),
    (torch.float32, 136, 0.0, 'head_dim <= 128, got 136'),
    (torch.float64, 16, 0.0, 'got torch.float64'),
])
def test_unsupported_inputs_name_the_fix(dtype, d, dropout_p, match):
    q = torch.randn(1, 1, 17, d, dtype=dtype)
    with pytest.raises(ValueError, match=match) as info:
        mita_attention(q, q, q, (4, 4), pool_size=2, topk=3,
                       backend='triton', dropout_p=dropout_p)
    assert "backend='torch'" in str(info.value)


def test_through_the_operator_equals_the_entry_point():
    ref_leaves, low = _leaves(random_qkv(1, 2, 1 + 20, 16))
    out = mita_attention(*low, (4, 5), pool_size=2, topk=6,
                         landmarks='official', backend='triton')
    want = triton_backend.mita_triton(
        *low, plan_of(low[0], (4, 5), 1, 2, 6, landmarks='official'))
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_cpu_tensors_without_the_interpreter_name_the_fix(monkeypatch):
    monkeypatch.setattr(triton_backend, 'interpreted', lambda: False)
    q = torch.randn(1, 1, 17, 16)
    with pytest.raises(ValueError, match='TRITON_INTERPRET=1'):
        mita_attention(q, q, q, (4, 4), pool_size=2, topk=3,
                       backend='triton')


def test_missing_triton_names_the_fix(monkeypatch):
    from mmseg_mita.ops import declaration
    monkeypatch.setitem(declaration._AVAILABLE, 'triton', False)
    q = torch.randn(1, 1, 17, 16)
    with pytest.raises(ValueError, match='needs the module triton: `pip '
                       'install triton`'):
        mita_attention(q, q, q, (4, 4), pool_size=2, topk=3, backend='triton')
