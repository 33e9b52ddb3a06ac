"""The fused Triton kernels compiled ahead of time for real GPUs, without
one.

``mmseg_mita.bench.triton_aot`` runs the backend's own launch code (a
forward and its backward) on ``meta`` tensors with a stand-in Triton driver
for ``sm_80``, ``sm_89`` and ``sm_90``, so every launch is compiled as a
launch on that GPU would compile it (specialisation, block sizes,
num_warps, num_stages), by triton's compiler and the ptxas of the triton
wheel. All cases compile in child processes without ``TRITON_INTERPRET``
(this process runs triton in its interpreter: ``tests/conftest.py``), sharing
the session's triton cache: a compile is done once. N = 1025 and 4097 give
every distinct compile (the block sizes change between them; float32 and
the larger N compile nothing new); N = 65537 (6 heads, batch 1) gives the
smallest grids against the most work.

Checked per case: every launch compiles, its SASS counts agree with
ptxas's own report and its kernel has an entry in the cost model with as
many trip counts as its SASS has loops; shared memory fits a block of the
target; no register spills (bf16, fp16); no GPU-scope fence or L1
invalidation in the SASS (``MEMBAR.ALL.GPU`` and ``CCTL.IVALL`` around an
acquire-release atomic); every grid at N = 65537 has at least one program
per SM of the reference part. Compiling restores everything it changes in
triton (a last test).
"""
import math
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip(
    'triton', reason='triton is a test dependency: pip install triton')

from mmseg_mita.bench import hardware, kernels, sass  # noqa: E402
from mmseg_mita.bench.triton_aot import (CallShape, Case,  # noqa: E402
                                         compile_isolated)

ARCHS = (80, 89, 90)
CASES = [(arch, dtype, tokens, 64) for arch in ARCHS
         for dtype in ('bfloat16', 'float16', 'float32')
         for tokens in (1025, 4097, 65537)]
CASES += [(arch, 'bfloat16', 4097, 128) for arch in ARCHS]


def _id(case) -> str:
    arch, dtype, tokens, head_dim = case
    return f'sm_{arch}-{dtype}-N{tokens}-d{head_dim}'


def _cases(select=lambda case: True, check=None):
    """``CASES`` that ``select`` keeps (with ``check`` first, if given)."""
    params = []
    for case in filter(select, CASES):
        values, name = ((case, ), _id(case)) if check is None else (
            (check, case), f'{check}-{_id(case)}')
        params.append(pytest.param(*values, id=name))
    return params


@pytest.fixture(scope='module')
def compiled(triton_cache):
    """Every case's launches (Triton kernels and ATen ops), by case."""
    cases = [
        Case(arch, dtype, CallShape(tokens, head_dim=head_dim))
        for arch, dtype, tokens, head_dim in CASES
    ]
    results = compile_isolated(cases, triton_cache,
                               workers=min(len(ARCHS), os.cpu_count() or 1),
                               timeout=1800)
    return dict(zip(CASES, (r['launches'] for r in results)))


def _kernels(compiled, case):
    return [launch for launch in compiled[case] if launch['kind'] == 'triton']


def _static(launch) -> dict:
    return sass.totals([
        sass.Region(tuple(r['loops']), r['counts'], r['mma'])
        for r in launch['regions']
    ])


@pytest.mark.parametrize('case', _cases())
def test_every_launch_compiles(compiled, case):
    launches = _kernels(compiled, case)
    assert {launch['stage'] for launch in launches} == {'forward', 'backward'}
    for launch in launches:
        static = _static(launch)
        assert 0 < launch['registers'] <= 255 and static['instructions'] > 0
        report = launch['compile'] and launch['compile']['ptxas']
        if report:  # compiled here (not a cache hit): ptxas agrees
            assert report == dict(
                registers=launch['registers'], stack=launch['stack'],
                spill_store_bytes=static['spill_store_bytes'],
                spill_load_bytes=static['spill_load_bytes'])
        model = kernels.model_of(launch['name'])
        kernels.per_program(launch, model.trips(kernels.Args(launch)))


@pytest.mark.parametrize('case', _cases())
def test_shared_memory_fits_a_block(compiled, case):
    limit = hardware.arch(case[0]).smem_per_block
    over = {l['name']: l['shared'] for l in _kernels(compiled, case)
            if l['shared'] > limit}
    assert not over, f'over {limit} B: {over}'


# SASS counts that must be zero: spills (bf16, fp16) and GPU-scope fences.
ZERO = dict(spills=('spill_store_bytes', 'spill_load_bytes'),
            fences=('gpu_fences', 'l1_invalidations'))


@pytest.mark.parametrize(
    'check, case',
    _cases(select=lambda case: case[1] != 'float32', check='spills') +
    _cases(check='fences'))
def test_no_spills_or_gpu_scope_fences(compiled, check, case):
    found = {}
    for launch in _kernels(compiled, case):
        static = _static(launch)
        if any(static[f] for f in ZERO[check]):
            found[launch['name']] = {f: static[f] for f in ZERO[check]}
    assert not found, f'{check} (bytes a thread, or counts): {found}'


@pytest.mark.parametrize('case', _cases())
def test_merge_recomputes_logits_with_the_keys_pass_product(compiled, case):
    # The merge's recompute of the best chunks' logits is bit for bit the
    # keys pass's only with the same product: a tile of as many landmark
    # rows (every landmark in one tile of 64 on sm_90 in 16 bits with
    # chunks of several tokens, N > 1025 here; else 16), and 16-row
    # tensor-core products in both (mma.sync: a 64-row product on 4 warps
    # would be a wgmma, the merge's one warp cannot run one).
    launch = {x['name']: x for x in _kernels(compiled, case)}
    arch, dtype, tokens, head_dim = case
    rows = 6 if (arch == 90 and dtype != 'float32' and head_dim <= 64 and
                 tokens > 1025) else 4
    assert launch['_keys']['args']['LOG_L'] == rows
    assert launch['_merge']['args']['LOG_L'] == rows


@pytest.mark.parametrize('tokens,rows', [(4097, 64), (1025, 16)])
def test_logits_are_16_row_products_in_both_passes(triton_cache, tokens,
                                                   rows):
    # sm_90, bf16: the keys pass's R K^T (tiles of 64 landmarks at 4097, 16
    # at 1025) and the merge's recompute (of chunks of several tokens) are
    # both mma.sync m16n8k16
    # (HMMA.16816; a 64-row tl.dot on 4 warps is a wgmma, HGMMA, which the
    # merge's one warp cannot run: the two could round differently).
    result, = compile_isolated([Case(90, 'bfloat16', CallShape(tokens))],
                               triton_cache, keep_sass=True, timeout=900)
    launch = {x['name']: x for x in result['launches']}
    assert launch['_keys']['args']['LOG_L'] == rows.bit_length() - 1
    assert 'HMMA.16816.F32.BF16' in launch['_keys']['sass']
    if launch['_merge']['args']['LOG_C'] > 0:  # it recomputes (not at 1025)
        assert 'HMMA.16816.F32.BF16' in launch['_merge']['sass']
    assert 'HGMMA' not in launch['_merge']['sass']


@pytest.mark.parametrize('case', _cases(select=lambda case: case[2] == 65537))
def test_grid_fills_one_wave(compiled, case):
    part = hardware.PARTS[hardware.REFERENCE_PART[case[0]]]
    short = {
        launch['name']: math.prod(launch['grid'])
        for launch in _kernels(compiled, case)
        if math.prod(launch['grid']) < part.sms
    }
    assert not short, f'fewer programs than the {part.sms} SMs of ' \
        f'{part.name}: {short}'


@pytest.mark.parametrize('case', _cases(select=lambda case: case[2] == 65537))
def test_settings_follow_the_devices_sms(compiled, case):
    # The SMs are the device's, from triton's driver (the stand-in gives the
    # reference part's: 108 on sm_80): the keys pass about two programs an
    # SM (within two a group: its chunk is a whole number of key tiles),
    # the pooling 4 warps below 4 programs an SM (the merge, its top-k
    # fused, 1 whatever its grid).
    part = hardware.PARTS[hardware.REFERENCE_PART[case[0]]]
    launch = {x['name']: x for x in _kernels(compiled, case)}
    keys = math.prod(launch['_keys']['grid'])
    assert abs(keys - 2 * part.sms) <= 2 * 6, keys
    assert launch['_pool']['num_warps'] == 4
    assert launch['_merge']['num_warps'] == 1


SCRIPT = textwrap.dedent('''
    import sys
    from triton import knobs
    from triton.compiler import compiler
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction
    from mmseg_mita.bench import triton_aot
    from mmseg_mita.ops import triton_backend

    KERNELS = triton_backend.KERNEL_FUNCTIONS
    assert all(isinstance(fn, JITFunction) for fn in KERNELS)

    def state():
        return (driver._active, compiler.max_shared_mem,
                [(id(fn.device_caches), len(fn.device_caches))
                 for fn in KERNELS], knobs.cache.dir,
                knobs.compilation.listener, knobs.nvidia.dump_ptxas_log,
                sys.stdout)

    before = state()
    launches = triton_aot.compile_call(90, triton_aot.CallShape(1025),
                                       'bfloat16', sys.argv[1])
    assert any(l['kind'] == 'triton' for l in launches)
    assert state() == before, (before, state())
''')


def test_compiling_restores_triton(triton_cache, repo_root):
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = repo_root
    proc = subprocess.run([sys.executable, '-c', SCRIPT, triton_cache],
                          env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
