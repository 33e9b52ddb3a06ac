"""The static cost model (mmseg_mita.bench.kernels): its arithmetic on a
launch written by hand, and the ``kernels`` command at one target and one
shape (compiled for sm_90 in a subprocess, without a GPU)."""
import argparse
import json
import re

import pytest

from mmseg_mita.bench import hardware, kernels
from mmseg_mita.bench.triton_aot import CallShape

H200 = hardware.TIMED_PART


def _launch(grid, regions, registers=64, shared=1024, warps=4):
    return dict(kind='triton', name='_toy', stage='forward', grid=grid,
                num_warps=warps, num_stages=3, registers=registers,
                shared=shared, args=dict(n=160), regions=regions)


@pytest.fixture
def toy(monkeypatch):
    """A kernel whose one loop runs n / 16 times, moving 1 MB and doing
    1 GFLOP."""
    model = kernels.KernelModel(trips=lambda a: [a.n / 16],
                                bytes=lambda a: 1e6, flops=lambda a: 1e9)
    monkeypatch.setitem(kernels.KERNELS, '_toy', model)
    return model


def _region(loops, instructions, mma=None, **counts):
    return dict(loops=loops, mma=mma or {},
                counts=dict(dict.fromkeys(kernels.sass.FIELDS, 0),
                            instructions=instructions, **counts))


def test_estimate_of_a_launch_by_hand(toy):
    # 10 trips of a loop of 100 instructions, 1024 bf16 multiply-adds and
    # one fenced atomic of 16 bytes a lane; 50 instructions outside.
    regions = [_region([], 50), _region([0], 100, dict(BF16=1024),
                                         atomics=1, atomic_bytes=512,
                                         gpu_fences=1)]
    launch = _launch([264, 1, 1], regions)
    got = kernels.estimate(launch, toy, 1e6)
    assert got['instructions_per_warp'] == 1050
    assert got['issue_cycles'] == 4 * 1050 / 4
    assert got['tensor_cycles'] == 4 * 10 * 1024 / 2048
    # 264 programs: 2 per SM, both resident at once (4 warps, 64 registers):
    # one round of 10 fences.
    cycles = 2 * 1050 + 1 * 10 * kernels.FENCE_CYCLES
    assert got['sm_s'] == pytest.approx(cycles / H200.clock_hz)
    traffic = 1e6 + 2 * 264 * 4 * 10 * 512
    assert got['memory_s'] == pytest.approx(traffic / 4.8e12)
    assert got['estimate_s'] == max(got['sm_s'], got['memory_s'])


def test_a_warp_issues_at_most_one_instruction_a_clock(toy):
    # One-warp programs, 3 per SM (396 of them), all resident at once: the
    # schedulers could issue 3 x 1050 / 4 warp instructions in 788 clocks,
    # but each warp needs 1050 clocks to issue its own.
    regions = [_region([], 50), _region([0], 100)]
    got = kernels.estimate(_launch([396, 1, 1], regions, warps=1), toy, 0)
    assert got['issue_cycles'] == 1050 / 4
    assert got['sm_s'] == pytest.approx(1050 / H200.clock_hz)
    # 2 warps, 9 per SM: the schedulers are the bound (9 x 2 x 1050 / 4).
    got = kernels.estimate(_launch([9 * 132, 1, 1], regions, warps=2), toy,
                           0)
    assert got['sm_s'] == pytest.approx(9 * 2 * 1050 / 4 / H200.clock_hz)
    # Rounds of resident blocks: 4 programs of 1 warp per SM, 1 resident
    # (its shared memory): 4 rounds of 1050.
    got = kernels.estimate(
        _launch([4 * 132, 1, 1], regions, warps=1, shared=200 * 1024), toy,
        0)
    assert got['sm_s'] == pytest.approx(4 * 1050 / H200.clock_hz)


def test_masked_atomic_lanes_move_no_bytes(toy, monkeypatch):
    # Live rows 49 of 64 in tiles of 32 (two loops: 49 + 49 of 2 x 64), 48
    # head dims of 64: the atomics' traffic is their live share.
    args = kernels.Args(dict(args=dict(m=49, k=49, d=48, BLOCK_D=64),
                             grid=[1, 1, 1]))
    share = kernels._live_share(args, [args.m, args.k], 32)
    assert share == pytest.approx(98 / 128 * 48 / 64)
    monkeypatch.setitem(kernels.KERNELS, '_toy',
                        toy._replace(atomic_share=lambda a: 0.25))
    regions = [_region([], 1), _region([0], 1, atomics=1, atomic_bytes=512)]
    got = kernels.estimate(_launch([264, 1, 1], regions),
                           kernels.KERNELS['_toy'], 1e6)
    traffic = 1e6 + 2 * 264 * 4 * 10 * 512 * 0.25
    assert got['memory_s'] == pytest.approx(traffic / 4.8e12)


def test_experts_backward_shares_out_its_tiles():
    # N = 1025, m = k = 49 (21 queries an expert: one tile of 32 each),
    # 81 blocks of 32 slots, 6 programs a group: 49 tiles hold queries,
    # 49 / 6 a program; per tile 49 routed rows of 2 x 32 atomically added,
    # per program 49 landmark rows of 64.
    launch = dict(args=dict(
        n=1025, m=49, k=49, d=64, BLOCK_D=64, BLOCK_M=32, BLOCK_N=32,
        M_PAD=64, slots_per_group=81 * 32, SUM_LANDMARKS=True),
        grid=[48, 6, 1])
    model = kernels.KERNELS['_experts_bwd']
    args = kernels.Args(launch)
    assert model.trips(args) == [pytest.approx(49 / 6), 2]
    tiles = 49 / 6
    assert model.atomic_share(args) == pytest.approx(
        (tiles * 49 + 49) / (tiles * 64 + 64))
    # dR, dVt added a tile: the compressed keys' loop too, 49 + 49 rows of
    # 2 x 32 a tile.
    launch['args']['SUM_LANDMARKS'] = False
    args = kernels.Args(launch)
    assert model.trips(args) == [pytest.approx(49 / 6), 2, 2]
    assert model.atomic_share(args) == pytest.approx(98 / 128)


def test_small_grids_get_a_share_of_the_bandwidth(toy):
    launch = _launch([33, 1, 1], [_region([], 1), _region([0], 1)])
    got = kernels.estimate(launch, toy, 1e6)
    assert got['memory_s'] == pytest.approx(1e6 / (4.8e12 * 33 / 132))


def test_a_block_that_does_not_fit_has_no_estimate(toy):
    launch = _launch([1, 1, 1], [_region([0], 1)], shared=228 * 1024)
    assert kernels.estimate(launch, toy, 1e6)['estimate_s'] is None


def test_loops_and_trip_counts_must_agree(toy):
    launch = _launch([1, 1, 1], [_region([0], 1), _region([1], 1)])
    with pytest.raises(ValueError, match='2 loops in its SASS, 1 trip'):
        kernels.estimate(launch, toy, 1e6)


def test_a_kernel_without_an_entry_is_refused():
    with pytest.raises(ValueError, match='_nope has no entry'):
        kernels.model_of('_nope')


def test_attention_roofline():
    shape = CallShape(1025, batch=8)
    tensor, lse = 48 * 1025 * 64 * 2, 48 * 1025 * 4
    fwd = kernels.attention_roofline(shape, 'bfloat16', 'forward')
    assert fwd['flops'] == 4 * 1025**2 * 64 * 48  # Q K^T, P V
    assert fwd['bytes'] == 4 * tensor + lse  # q, k, v read; o, lse written
    assert fwd['roofline_s'] == pytest.approx(fwd['flops'] / 989e12)
    bwd = kernels.attention_roofline(shape, 'bfloat16', 'backward')
    assert bwd['flops'] == 2.5 * fwd['flops']  # Q K^T again, 4 gradients
    assert bwd['bytes'] == 8 * tensor + lse  # q k v o dO lse; dq dk dv
    total = kernels.attention_roofline(shape, 'bfloat16', 'total')
    assert total['flops'] == 3.5 * fwd['flops']
    assert total['bytes'] == 12 * tensor + 2 * lse
    # Two launches: the sum of the stages' rooflines; at 65 tokens the
    # forward is bound by its bytes, the backward too.
    small = CallShape(65, batch=1)
    stages = [kernels.attention_roofline(small, 'bfloat16', s)
              for s in ('forward', 'backward', 'total')]
    assert stages[0]['roofline_s'] == pytest.approx(stages[0]['bytes'] /
                                                    4.8e12)
    assert stages[2]['roofline_s'] == pytest.approx(
        stages[0]['roofline_s'] + stages[1]['roofline_s'])


def test_aten_bytes():
    topk = dict(name='aten::topk',
                inputs=[dict(dtype='float32', shape=[6, 49, 100])],
                outputs=[dict(dtype='float32', shape=[6, 49, 49]),
                         dict(dtype='int64', shape=[6, 49, 49])])
    assert kernels.aten_bytes(topk) == 6 * 49 * (100 * 4 + 49 * 12)
    fill = dict(name='aten::new_zeros',
                inputs=[dict(dtype='bfloat16', shape=[1000])],
                outputs=[dict(dtype='float32', shape=[10])])
    assert kernels.aten_bytes(fill) == 40


def test_kernels_command_one_target_one_shape(tmp_path, triton_cache,
                                              capsys):
    parser = argparse.ArgumentParser()
    kernels.add_arguments(parser)
    args = parser.parse_args(
        ['--archs', '90', '--shapes', '1025', '--cache-dir', triton_cache])
    args.command = 'kernels'
    args.json = str(tmp_path / 'k.json')
    args.markdown = str(tmp_path / 'k.md')
    assert kernels.run(args) == 0
    printed = capsys.readouterr().out
    with open(args.markdown) as f:
        markdown = f.read()
    with open(args.json) as f:
        doc = json.load(f)
    assert doc['command'] == 'kernels' and doc['versions']['triton']
    names = [r['name'] for r in doc['rows'] if r['kind'] == 'triton']
    assert set(names) <= set(kernels.KERNELS) and names
    for r in doc['rows']:
        assert r['arch'] == 90 and r['tokens'] == 1025
        assert r['roofline_s'] > 0 and r['estimate_s'] is not None
        assert f"| {r['name']} | 1025 x 6 |" in markdown
        assert r['name'] in printed
    total = [s for s in doc['stages'] if s['stage'] == 'total']
    assert len(total) == 1 and total[0]['launches'] == len(doc['rows'])
    assert total[0]['roofline_s'] == pytest.approx(
        sum(r['roofline_s'] for r in doc['rows']))
    assert [t['key'] for t in doc['targets']] == [
        t.key for t in kernels.TARGETS
    ]


def _launch_row(tokens, stage, roofline_us, estimate_us, nbytes,
                arch=90):
    return dict(arch=arch, tokens=tokens, stage=stage, kind='triton',
                roofline_s=roofline_us * 1e-6,
                estimate_s=None if estimate_us is None else
                estimate_us * 1e-6, bytes=nbytes)


def _stage(tokens, stage, roofline_us, estimate_us, attention_us,
           attention_bytes, arch=90):
    return dict(arch=arch, tokens=tokens, stage=stage,
                roofline_s=roofline_us * 1e-6,
                estimate_s=None if estimate_us is None else
                estimate_us * 1e-6, attention_roofline_s=attention_us * 1e-6,
                attention_bytes=attention_bytes)


def test_targets_values_at_their_bounds():
    """Each kind of target on rows written by hand: a value equal to its
    bound is met; kernels under ``min_roofline_s`` do not count for it;
    other parts (sm_80) do not count at all."""
    rows = [
        _launch_row(1025, 'forward', 10, 20, 100),  # 2.0x, roofline 10 us
        _launch_row(1025, 'backward', 2, 6, 150),  # 3.0x, roofline 2 us
        _launch_row(4097, 'forward', 10, 15, 10),
        _launch_row(1025, 'forward', 1, 100, 10**9, arch=80),
    ]
    stages = [
        _stage(1025, 'forward', 10, 20, 0, 0),  # 2.0
        _stage(1025, 'backward', 2, 6, 0, 0),  # 3.0
        _stage(1025, 'total', 12, 90, 45, 100),
        _stage(4097, 'total', 10, 40, 100, 10),
        _stage(1025, 'total', 1, 1, 1, 1, arch=80),
    ]
    targets = {t.key: t for t in kernels.TARGETS}
    want = {
        'kernel_estimate_within_3x_roofline': (3.0, True),
        'kernel_estimate_within_2x_roofline_from_5us': (2.0, True),
        'kernel_estimate_within_2x_roofline': (3.0, False),
        'stage_estimate_within_2x_roofline': (3.0, False),
        'bytes_1025_vs_attention': (2.5, True),  # 250 bytes over 100
        'estimate_1025_us': (90.0, True),
        'roofline_1025_vs_attention': (12 / 45, True),
        'estimate_4097_vs_attention_roofline': (0.40, True),
    }
    for key, (value, met) in want.items():
        got = kernels._target(targets[key], rows, stages)
        assert got['value'] == pytest.approx(value), key
        assert got['met'] is met, key
    missing = kernels._target(
        targets['estimate_65537_vs_attention_roofline'], rows, stages)
    assert missing['value'] is None and not missing['met']
    assert 'no sm_90 call' in missing['why']
    rows[0]['estimate_s'] = None  # a launch without an estimate
    unfit = kernels._target(targets['kernel_estimate_within_3x_roofline'],
                            rows, stages)
    assert unfit['value'] is None and 'does not fit' in unfit['why']
    assert [t.key for t in kernels.TARGETS if t.diagnostic] == [
        'kernel_estimate_within_2x_roofline', 'roofline_1025_vs_attention']


@pytest.mark.parametrize('tokens, message', [(49, 'need tokens >= 50'),
                                              (1 + 5 * 13, 'narrower')])
def test_shapes_that_cannot_be_pooled_are_refused(tokens, message, capsys):
    from mmseg_mita.bench import cli
    with pytest.raises(SystemExit) as exit_:
        cli.main(['kernels', '--archs', '90', '--shapes', str(tokens)])
    assert exit_.value.code == 2
    assert re.search(f'--shapes: tokens={tokens}.*{message}',
                     capsys.readouterr().err)
