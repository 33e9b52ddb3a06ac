"""The fused Triton pipeline on CPU through Triton's interpreter, against the
dense float64 per-query reference (forward and gradients of q, k and v).

``TRITON_INTERPRET=1`` is set by ``tests/conftest.py`` when
there is no GPU (before triton is first imported); with a GPU these tests
skip and ``test_cuda_backends.py`` runs the compiled kernels. The
interpreter has no float64 ``tl.dot``: float32 inputs are checked against the
float64 reference on the same values at a tight tolerance. The
interpreter's own tiles are 16 queries / keys / landmarks, so the small
cases below span several tiles (m, k > 16), several blocks per expert, a
padded head_dim and, at N = 82, one expert holding every query; the
``gpu_tiles`` cases run the tiles a GPU uses (blocks of 32 and 64 queries,
64 keys, the keys pass split over N with an uneven last split).
"""
import pytest
import torch
import torch.nn.functional as F
from low_precision import (assert_as_accurate_as_torch, relative_error,
                           triton_with_routing)
from mita_testing import (aligned_qkv, assert_same_gradients,
                          assert_topk_is_largest, experts_of, plan_of,
                          random_qkv)
from torch.utils._python_dispatch import TorchDispatchMode

from mmseg_mita.bench import hardware
from mmseg_mita.ops import REGISTRY, mita_attention, naive_mita
from mmseg_mita.ops.torch_backend import attend_experts

pytest.importorskip(
    'triton', reason='triton is a test dependency: pip install triton')
from mmseg_mita.ops import triton_backend  # noqa: E402
from mmseg_mita.ops.triton_backend import custom_ops, settings  # noqa: E402

pytestmark = [
    pytest.mark.skipif(
        torch.cuda.is_available(),
        reason='a GPU is present: the kernels are compiled, and '
        'tests/ops/test_cuda_backends.py runs them'),
    # The interpreter's own loop bounds (triton 3.6, numpy 1.25 to 2.3).
    pytest.mark.filterwarnings(
        'ignore:Conversion of an array with ndim > 0:DeprecationWarning'),
]
BLOCK = 16  # queries per block in the interpreter (_Config)


def test_kernels_run_in_the_interpreter_without_a_gpu():
    # Were triton imported before TRITON_INTERPRET=1 is set (by any module
    # a test imports), every test below would fail on CPU tensors.
    assert triton_backend.interpreted(), (
        'triton was imported before tests/conftest.py set TRITON_INTERPRET=1')


@pytest.fixture
def gpu_tiles(monkeypatch):
    """``use(arch, dtype, merge_warps=None)``: the kernels then run
    (interpreted, on float32 data, IEEE products) with the tiles that a GPU
    of compute capability ``arch`` picks for ``dtype`` inputs (the merge on
    ``merge_warps``, a row of its sort a warp, where given)."""

    def use(arch, dtype, merge_warps=None):

        def config(q, m, k):
            b, heads, n, d = q.shape
            part = hardware.PARTS[hardware.REFERENCE_PART[arch]]
            cfg = triton_backend.Config(n, m, d, min(k, n), b * heads, dtype,
                                         arch, part.sms)
            cfg.precision, cfg.upcast = 'ieee', False
            if merge_warps is not None:
                cfg.options['merge']['num_warps'] = merge_warps
            return cfg

        monkeypatch.setattr(settings, 'call_config', config)

    return use


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


def _check_against_reference(b, h, hw, extra, pool, topk, d,
                             landmarks='patches', inputs=None):
    n = extra + hw[0] * hw[1]
    ref_leaves, low = _leaves(inputs or random_qkv(b, h, n, d))
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
        (1, 1, (10, 12), 1, (3, 3), 80, 16, 'patches'),  # k > 64: torch.topk
    ])
def test_float32_matches_reference(b, h, hw, extra, pool, topk, d, landmarks):
    _check_against_reference(b, h, hw, extra, pool, topk, d, landmarks)


@pytest.mark.parametrize(
    'arch,dtype,case',
    [
        # Blocks of 32 queries; K_PAD 16 out of 64-key tiles; 2 splits of
        # the keys pass (128 + 8 tokens); batch, heads, odd grid.
        (90, torch.bfloat16, (2, 2, (9, 15), 1, (2, 3), 10, 16)),
        # Blocks of 128 (64 queries a program forward, 128 backward on 8
        # warps): experts of about 80 queries; 3 splits (128 + 128 + 66);
        # K_PAD = the 64-key tile; 2 extra tokens.
        (89, torch.bfloat16, (1, 1, (16, 20), 2, (2, 2), 40, 16)),
        # Blocks of 64: experts of about 38 queries, some spanning two; 2
        # splits (128 + 98).
        (90, torch.bfloat16, (1, 1, (14, 16), 2, (2, 3), 40, 16)),
        # topk >= N, one split shorter than a key tile.
        (80, torch.float16, (1, 1, (5, 6), 0, (2, 3), 1000, 16)),
        # float32's tiles: blocks of 32, 32 keys; 3 splits (64 + 64 + 3).
        (90, torch.float32, (1, 2, (10, 13), 1, (2, 2), 20, 16)),
        # head_dim 96: BLOCK_D 128, 32-key tiles; blocks of 64, the
        # backward 32 queries a program; official landmarks.
        (90, torch.bfloat16, (1, 1, (12, 11), 1, (2, 2), 12, 96, 'official')),
        # k > 64: R K^T stored, torch.topk.
        (90, torch.bfloat16, (1, 1, (10, 12), 1, (3, 3), 80, 16)),
        # Chunks of 2 tokens (N = 513, k <= 16): the keys pass's landmarks
        # in one tile, of 64 rows for m = 49 (15 padding), of 32 for m =
        # 25; 4 splits.
        (90, torch.bfloat16, (1, 1, (16, 32), 1, (7, 7), 12, 16)),
        (90, torch.bfloat16, (1, 1, (16, 32), 0, (5, 5), 9, 16)),
    ])
def test_gpu_tiles_match_reference(gpu_tiles, arch, dtype, case):
    gpu_tiles(arch, dtype)
    _check_against_reference(*case)


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


@pytest.mark.parametrize('tiles', [None, (90, torch.bfloat16)])
def test_one_expert_gets_every_query(gpu_tiles, tiles):
    # 82 queries along one landmark direction: all in one expert, spanning
    # 6 blocks of 16 (the GPU's block for N / m = 9); the other 8 experts get
    # none.
    if tiles:
        gpu_tiles(*tiles)
    hw, d = (9, 9), 16
    n = 1 + hw[0] * hw[1]
    ref_leaves, low = _leaves(aligned_qkv(1, 2, n, d))
    experts = experts_of(*ref_leaves, hw, 1, (3, 3), 5)
    assert (experts.expert == experts.expert[:, :1]).all()
    ref = naive_mita(*ref_leaves, hw, pool_size=3, topk=5)
    out = triton_backend.mita_triton(*low, plan_of(low[0], hw, 1, 3, 5))
    _assert_close(out, ref, low, ref_leaves)


def _expert_ids(g, n, m, block=BLOCK, seed=0):
    """Random expert ids [G, N] with, in group 0, exactly ``block + 1``
    queries in expert 2 and none in experts 0 and 5."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, m, (g, n), generator=gen)
    others = torch.tensor([e for e in range(m) if e not in (0, 2, 5)])
    ids[0] = others[torch.randint(0, len(others), (n, ), generator=gen)]
    ids[0, torch.randperm(n, generator=gen)[:block + 1]] = 2
    return ids


def _fused_forward(q, k, v, hw, extra, pool, topk, expert=None,
                   topk_index=None):
    """The outputs of the forward op by name."""
    names = ('out', 'lse', 'landmarks', 'shared_values', 'lse_shared',
             'topk_index', 'expert', 'slots', 'block_expert')
    return dict(
        zip(
            names,
            triton_backend.mita_triton_fwd(q, k, v, *hw, extra, *pool, topk,
                                           expert, topk_index)))


@pytest.mark.parametrize('tiles', [None, (90, torch.bfloat16)])
def test_expert_with_one_query_more_than_a_block(gpu_tiles, tiles):
    # Routing held fixed: expert 2 of group 0 gets BLOCK + 1 queries (two
    # blocks, the second with one query), experts 0 and 5 none; ids outside
    # [0, m) (what a compiled argmax may return for a row it cannot order,
    # e.g. all NaN) go to expert 0, whose rows are then written. Against the
    # torch backend in float64 on the same routing.
    if tiles:
        gpu_tiles(*tiles)
    hw, pool, d, m = (6, 7), (2, 3), 16, 6
    n = 1 + hw[0] * hw[1]
    ref_leaves, low = _leaves(random_qkv(1, 2, n, d))
    ids = _expert_ids(2, n, m)
    ids[0, [3, 17]] = torch.tensor([-1, m])
    ids[1, 5] = m + 2**20
    experts = experts_of(*ref_leaves, hw, 1, pool, 8)
    experts = experts._replace(
        expert=torch.where((ids >= 0) & (ids < m), ids, 0)[..., None])
    ref = attend_experts(*ref_leaves, experts)
    out = triton_backend.mita_triton_routed(
        *low, plan_of(low[0], hw, 1, pool, 8), ids, experts.topk_index)
    _assert_close(out, ref, low, ref_leaves)


@pytest.mark.parametrize('tiles,hw,block,rows', [
    (None, (6, 7), BLOCK, None), ((90, torch.bfloat16), (14, 15), 64, None),
    ((90, torch.bfloat16), (14, 15), 64, 1),
    ((90, torch.bfloat16), (20, 20), 128, None),
    ((90, torch.bfloat16), (20, 20), 128, 2)])
def test_counting_sort_matches_a_plain_reference(gpu_tiles, tiles, hw,
                                                 block, rows):
    # The GPU's tiles: blocks of 64 queries, the keys pass in 2 splits
    # (128 + 83 tokens), the sort ranking 4 rows of 32 ids at a time (what
    # a small grid's 4 warps take; a large grid's 1 warp: 1 row, several
    # tiles a split); blocks of 128 (N / m = 67), 4 splits (2 rows). The
    # interpreter's tiles: 2 rows, more than a split holds.
    if tiles:
        gpu_tiles(*tiles, merge_warps=rows)
    g, m, d = 2, 6, 16
    n = 1 + hw[0] * hw[1]
    q, k, v = (t.detach().float() for t in random_qkv(1, g, n, d))
    ids = _expert_ids(g, n, m, block)
    res = _fused_forward(q, k, v, hw, 1, (2, 3), 3, ids,
                         torch.zeros(g, m, 3, dtype=torch.long))
    slots, block_expert = res['slots'], res['block_expert']
    assert (res['expert'] == ids).all()
    assert slots.shape == (g, block * (n // block + m))
    assert block_expert.shape == (g, n // block + m)
    for group in range(g):
        counts = torch.bincount(ids[group], minlength=m)
        blocks = (counts + block - 1) // block
        first = torch.cumsum(blocks, 0) - blocks
        want_expert = torch.full((block_expert.shape[1], ), -1)
        want_slots = torch.full((slots.shape[1], ), -1)
        for e in range(m):  # experts without a query get no block
            want_expert[first[e]:first[e] + blocks[e]] = e
            queries = (ids[group] == e).nonzero().flatten()  # stable order
            start = int(first[e]) * block
            want_slots[start:start + len(queries)] = queries
        assert block_expert[group].tolist() == want_expert.tolist()
        assert slots[group].tolist() == want_slots.tolist()
    assert block_expert[0, :3].tolist() == [1, 2, 2]  # block + 1: 2 blocks


@pytest.mark.parametrize('tiles', [None, (90, torch.bfloat16)])
def test_routing_is_the_first_argmax_and_nan_rows_go_to_expert_0(
        gpu_tiles, tiles):
    # Integer queries, landmarks of 2 x 2 bins: every score exact in
    # float32. The patch rows repeat with period 4, so landmark j + 12 is
    # landmark j: every query's best score is a tie, across the
    # interpreter's two routing tiles of 16 landmarks for some. The extra
    # tokens' queries are < 0 against landmarks > 0 (every score < 0,
    # never a padding expert: m = 24 of 32); one of them is NaN.
    if tiles:
        gpu_tiles(*tiles)
    hw, extra, pool, g, d = (8, 12), 3, (4, 6), 2, 16
    gen = torch.Generator().manual_seed(0)
    patches = torch.randint(1, 4, (1, g, 4, hw[1], d), generator=gen)
    q = torch.cat([
        -torch.randint(1, 4, (1, g, extra, d), generator=gen),
        patches.repeat(1, 1, 2, 1, 1).flatten(2, 3)
    ], 2).float()
    q[0, 1, 1] = float('nan')
    k, v = (t.detach().float()
            for t in random_qkv(1, g, q.shape[2], d)[:2])
    res = _fused_forward(q, k, v, hw, extra, pool, 5)
    marks = res['landmarks'].double()
    assert torch.equal(marks[:, :12], marks[:, 12:]) and (marks > 0).all()
    scores = q[0].double() @ marks.transpose(1, 2)
    assert (res['expert'] == scores.argmax(-1)).all()  # NaN row: 0
    assert res['expert'][1, 1] == 0
    assert res['out'][0, 1, 1].isnan().all() and res['lse'][1, 1].isnan()
    assert not res['out'][0, 0].isnan().any()


@pytest.mark.parametrize('tiles,topk', [(None, 6), (None, 20),
                                        ((90, torch.bfloat16), 10),
                                        ((90, torch.bfloat16), 40),
                                        ((90, torch.float32), 20)])
def test_topk_is_the_largest_logits_lower_token_on_ties(gpu_tiles, tiles,
                                                        topk):
    # Integer keys and queries, landmarks of 4 x 4 bins: R K^T exact in
    # float32, and below 0 but for one key in 500 (the order of negative
    # floats); key 7 is NaN, ranked above every number (as torch.topk ranks
    # it); the last key of landmark 0 is made its k-th key (a tie at the
    # boundary, where the lower token must win). The GPU's tiles: 3 splits
    # of the keys pass (128 + 128 + 1 tokens), top-k lists of 16 out of
    # 64-key tiles (k = 10) and of one tile (k = 40); float32: 5 splits.
    if tiles:
        gpu_tiles(*tiles)
    hw, pool, g, d = (16, 16), (4, 4), 2, 16
    gen = torch.Generator().manual_seed(1)
    q = torch.randint(1, 4, (1, g, 1 + 256, d), generator=gen).float()
    k = torch.randint(-3, 2, (1, g, 1 + 256, d), generator=gen).float()
    k[0, :, 7] = float('nan')

    def ranks(marks):
        logits = marks.double() @ k[0].double().transpose(1, 2)
        return torch.where(logits.isnan(), float('inf'), logits)

    marks = F.adaptive_avg_pool2d(
        q[0, :, 1:].transpose(1, 2).reshape(g, d, *hw), pool)
    order = torch.sort(-ranks(marks.flatten(2).transpose(1, 2))[0, 0],
                       stable=True).indices
    k[0, 0, order[-1]] = k[0, 0, order[topk - 1]]
    res = _fused_forward(q, k, torch.randn(q.shape), hw, 1, pool, topk)
    rank = ranks(res['landmarks'])
    want = torch.sort(-rank, stable=True).indices[..., :topk]
    assert torch.equal(res['topk_index'].sort(-1).values,
                       want.sort(-1).values)
    kth = rank[0, 0].sort(descending=True).values[topk - 1:topk + 1]
    assert kth[0] == kth[1]  # the tie at the boundary


@pytest.fixture
def chunking(monkeypatch):
    """``use(log_c, log_g, keys_l=None)``: the fused top-k's chunks of
    ``2**log_c`` tokens in groups of ``2**log_g`` (and the keys pass's
    landmarks ``keys_l`` a tile, where given; the interpreter's tiles
    otherwise)."""

    def use(log_c, log_g, keys_l=None):
        config = settings.call_config

        def forced(q, m, k):
            cfg = config(q, m, k)
            cfg.log_c, cfg.log_g = log_c, log_g
            if keys_l is not None:
                cfg.keys_l = keys_l
            return cfg

        monkeypatch.setattr(settings, 'call_config', forced)

    return use


@pytest.mark.parametrize('log_c,log_g', [(2, 0), (1, 2), (2, 2), (0, 3)])
@pytest.mark.parametrize(
    'rows', ['random', 'equal', 'one_chunk', 'equal_maxima', 'last', 'nan'])
def test_topk_by_chunk_maxima_is_exact(chunking, rows, log_c, log_g):
    # The merge picks the K_PAD chunks (c tokens; in groups of g chunks:
    # first the K_PAD groups) of the largest maxima and recomputes their
    # tokens' logits: the set must be torch.topk's, lower token on ties.
    # Integer keys and queries, landmarks of 4 x 4 bins: R K^T exact. N =
    # 257 is no multiple of c (the last chunk holds one token, the last
    # group one chunk: the merge's last, partial tile); k = 6 of K_PAD =
    # 16; chunks of 1 to 4 tokens, in groups of 1 to 8. Rows: random (and
    # a NaN key); every key equal; the best keys all in one chunk; every
    # chunk's maximum equal (ties between chunks go to the lower one); the
    # last token the largest; a NaN landmark (every logit NaN, ranked above
    # every number: its first k tokens).
    chunking(log_c, log_g)
    hw, pool, g, d, topk = (16, 16), (4, 4), 2, 16, 6
    n = 1 + hw[0] * hw[1]
    gen = torch.Generator().manual_seed(2)
    q = torch.randint(1, 4, (1, g, n, d), generator=gen).float()
    k = torch.randint(-3, 2, (1, g, n, d), generator=gen).float()
    if rows == 'random':
        k[0, :, 7] = float('nan')
    elif rows == 'equal':
        k[:] = 1.0
    elif rows == 'one_chunk':  # 16 tokens from 128: every chunk size
        k[0, :, 128:144] = torch.randint(5, 9, (g, 16, d), generator=gen)
    elif rows == 'equal_maxima':  # one key of every 16 the largest
        k[0, :, ::16] = 4.0
    elif rows == 'last':
        k[0, :, -1] = 4.0
    else:
        q[0, 1, 1 + 3 * hw[1] + 2] = float('nan')  # in landmark 0's bin
    res = _fused_forward(q, k, torch.randn(q.shape), hw, 1, pool, topk)
    logits = res['landmarks'].double() @ k[0].double().transpose(1, 2)
    rank = torch.where(logits.isnan(), float('inf'), logits)
    want = torch.sort(-rank, stable=True).indices[..., :topk]
    assert torch.equal(res['topk_index'].sort(-1).values,
                       want.sort(-1).values)
    if rows == 'nan':
        assert res['landmarks'][1, 0].isnan().all()
        assert res['topk_index'][1, 0].sort().values.tolist() == list(
            range(topk))


@pytest.mark.parametrize('pool', [(4, 4), (7, 7)])
@pytest.mark.parametrize('log_c,log_g', [(0, 2), (2, 2)])
def test_topk_of_random_logits_is_the_largest(gpu_tiles, chunking, log_c,
                                              log_g, pool):
    # Random float32 inputs at the GPU's tiles, chunks of 1 token (no
    # recompute) or 4 in groups of 4: the check that test_cuda_backends.py
    # runs on the device, where only the compiled kernels can go wrong.
    # m = 16 in one tile of the keys pass, m = 49 in one of 64 rows (the
    # merge recomputes the candidates' logits on as many rows, 16 at a
    # time, as sm_90 does with chunks of several tokens).
    gpu_tiles(90, torch.bfloat16)
    chunking(log_c, log_g, keys_l=16 if pool == (4, 4) else 64)
    hw, topk = (16, 16), 10
    q, k, v = (t.detach().float() for t in random_qkv(1, 2, 257, 16))
    res = _fused_forward(q, k, v, hw, 1, pool, topk)
    assert_topk_is_largest(res['landmarks'], k, res['topk_index'])
    wrong = res['topk_index'].clone()
    wrong[1, 3, 0] = (wrong[1, 3].max() + 1) % 257  # the check can fail
    with pytest.raises(AssertionError):
        assert_topk_is_largest(res['landmarks'], k, wrong)


@pytest.mark.parametrize('log_c,log_g', [(2, 0), (1, 2)])
def test_topk_by_chunk_maxima_with_k_at_least_n(chunking, log_c, log_g):
    # k >= N: every token, in chunks of 4 (or 2 in groups of 4) of N = 31:
    # fewer groups than K_PAD = 32 (one partial tile of 8, or 4).
    chunking(log_c, log_g)
    _check_against_reference(1, 1, (5, 6), 1, (2, 3), 1000, 16)


def test_tied_top_k_logits_match_reference(gpu_tiles):
    # Queries along one direction (so are the landmarks); keys 5, 60 and
    # 130 are one key far along it: tied logits, the largest of every
    # landmark. The GPU's tiles (blocks of 32, 64-key tiles, 2 splits).
    gpu_tiles(90, torch.bfloat16)
    hw, d = (12, 12), 16
    q, k, v = aligned_qkv(1, 2, 1 + hw[0] * hw[1], d)
    with torch.no_grad():
        k[:, :, [5, 60, 130]] = 3 * q.mean(2, keepdim=True)
    _check_against_reference(1, 2, hw, 1, (3, 3), 8, d, inputs=[q, k, v])


@pytest.mark.parametrize('n,m,groups,warps', [
    (1025, 49, 48, 1), (4097, 49, 12, 2), (65537, 49, 6, 4),
    (65537, 49, 48, 1), (4097, 66, 16, 1), (4097, 65, 16, 2),
    (4097, 66, 8, 2), (4097, 65, 8, 4)])
def test_small_tiles_take_fewer_warps_on_larger_grids(n, m, groups, warps):
    # The pooling, and the merge without a fused top-k (k > 64; G x m
    # programs each here): 1 warp a program from 8 programs an SM (132 on
    # sm_90), 2 from 4, else 4: a scheduler keeps two warps or more. At the
    # bounds: 16 x 66 programs are 8 an SM, 16 x 65 fewer; 8 x 66 are 4.
    # With a fused top-k (k = 49) the merge takes 1 warp (its folds of 64
    # keys, 2 a lane, would be repeated or split by more).
    cfg = triton_backend.Config(n, m, 64, 80, groups, torch.bfloat16, 90)
    assert cfg.grid('merge')[1] == m and not cfg.fused_topk
    assert cfg.options['merge']['num_warps'] == cfg.sort_rows == warps
    assert cfg.options['pool']['num_warps'] == warps
    fused = triton_backend.Config(n, m, 64, 49, groups, torch.bfloat16, 90)
    assert fused.options['merge']['num_warps'] == fused.sort_rows == 1


def test_every_launch_fills_an_h200_at_65537_tokens():
    # N = 65537, 6 heads, batch 1, m = k = 49: at least one wave of
    # programs (132 SMs) per launch.
    cfg = triton_backend.Config(65537, 49, 64, 49, 6, torch.bfloat16, 90)
    for kernel in triton_backend.KERNELS:
        grid = cfg.grid(kernel)
        assert grid[0] * grid[1] >= 132, (kernel, grid)


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
    outs, grads = [], []
    for fn in (torch.compile(_call, fullgraph=True, backend=backend), _call):
        leaves = [t.clone().requires_grad_() for t in inputs]
        outs.append(fn(*leaves))
        grads.append(torch.autograd.grad(outs[-1].square().sum(), leaves))
    torch.testing.assert_close(*outs, rtol=1e-6, atol=1e-6)
    assert_same_gradients(*grads, rtol=1e-6, atol=1e-6)


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
        monkeypatch.setattr(custom_ops, name,
                            under_mode(getattr(custom_ops, name)))
    q, k, v = (
        t.detach().float().requires_grad_() for t in random_qkv(1, 2, 21, 16))
    with mode:
        out = _call(q, k, v)
        torch.autograd.grad(out.sum(), (q, k, v))
    with pytest.raises(AssertionError, match='nonzero'), mode:
        _call(q, k, v).nonzero()


@pytest.mark.parametrize('arch,dtype,n,d,m,rows', [
    (90, torch.bfloat16, 4097, 64, 49, 64),
    (90, torch.float16, 4097, 64, 25, 32),
    (90, torch.bfloat16, 65537, 64, 49, 64),
    (90, torch.bfloat16, 4097, 64, 6, 16),
    (90, torch.float32, 4097, 64, 49, 16),
    (90, torch.bfloat16, 4097, 128, 49, 16),
    (90, torch.bfloat16, 1025, 64, 49, 16),  # chunks of one token
    (89, torch.bfloat16, 4097, 64, 49, 16),
    (80, torch.float16, 4097, 64, 49, 16),
    (None, torch.bfloat16, 4097, 64, 49, 16),
])
def test_keys_pass_tiles_its_landmarks(arch, dtype, n, d, m, rows):
    # Every landmark in one tile (up to 64) on sm_90 in 16 bits with
    # head_dim <= 64 and chunks of several tokens (the keys streamed once);
    # 16 a tile elsewhere.
    cfg = triton_backend.Config(n, m, d, 49, 48, dtype, arch)
    assert (cfg.log_c > 0) == (n > 1025)
    assert cfg.keys_l == rows and cfg.block_l == 16


@pytest.mark.parametrize('arch', [80, 89, 90])
@pytest.mark.parametrize('n,dtype,m,k,one', [
    (4097, torch.bfloat16, 49, 49, True), (4097, torch.float16, 64, 64, True),
    (4097, torch.bfloat16, 49, 65, False), (8193, torch.bfloat16, 81, 49, False),
    (1025, torch.bfloat16, 49, 49, True), (4097, torch.float32, 25, 32, False)])
def test_experts_forward_pipelines_only_loops_of_several_trips(
        arch, n, dtype, m, k, one):
    # In 16 bits, one stage (and the registers ptxas needs for it) where
    # both loops (m compressed keys, k routed keys) are one tile of BLOCK_N
    # = 64, on every target, tiles of 32 queries (N = 1025, 2 warps) and
    # 64 alike; the target's stages where either takes two, and in float32
    # (tiles of 32 keys).
    cfg = triton_backend.Config(n, m, 64, k, 12, dtype, arch)
    assert cfg.block_n == (32 if dtype == torch.float32 else 64)
    assert (cfg.block_m > 32) == (n > 1025 and dtype != torch.float32)
    table = (2 if dtype == torch.float32 else
             triton_backend.settings._STAGES[arch][1])
    options = cfg.options['experts_fwd']
    assert options['num_stages'] == (1 if one else table)
    assert options.get('maxnreg') == (
        triton_backend.settings.MAX_REGISTERS if one else None)


def test_head_dim_128_runs_and_float32_dots_are_ieee():
    ref_leaves, low = _leaves(random_qkv(1, 1, 17, 128))
    ref = naive_mita(*ref_leaves, (4, 4), pool_size=2, topk=3)
    out = mita_attention(*low, (4, 4), pool_size=2, topk=3,
                         backend='triton')
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    # The interpreter computes every dot exactly: only the launch settings
    # show a float32 call on tensor-core tf32.
    for arch in (None, 80, 89, 90):
        cfg = triton_backend.Config(4097, 49, 64, 49, 6, torch.float32, arch)
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
    monkeypatch.setattr(settings, 'interpreted', lambda: False)
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
