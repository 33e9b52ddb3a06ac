"""tools/benchmark_scaling.py: workers, budgets, table, plot (tiny sizes)."""
import json

import pytest

pytest.importorskip('mmseg')
import benchmark_scaling  # noqa: E402  (tools/ is on sys.path: conftest)

SHRINK = [
    'model.backbone.num_layers=2', 'model.backbone.embed_dims=64',
    'model.backbone.num_heads=2', 'model.decode_head.in_channels=64',
    'model.decode_head.head_dims=16'
]


def test_measures_every_model_and_writes_json_table_plot(tmp_path, capsys):
    out = tmp_path / 'scaling'
    result = benchmark_scaling.main([
        '--heads', 'cbt', '--modes', 'inference', 'train', '--sizes', '32x32',
        '48x80', '--time-budget', '120', '--cfg-options', *SHRINK, '--json',
        f'{out}.json', '--markdown', f'{out}.md', '--plot', f'{out}.png'
    ])
    records = result['records']
    assert len(records) == 2 * 3 * 2  # modes x models x sizes
    for r in records:
        assert r['status'] == 'ok', r
        assert r['best_s'] > 0 and r['peak_bytes'] > 0
        assert len(r['load_before']) == len(r['load_after']) == 3
    assert {r['tokens'] for r in records} == {5, 16}  # 2x2+1, 3x5+1
    saved = json.loads(out.with_suffix('.json').read_text())
    assert saved['records'] == json.loads(json.dumps(records))
    assert saved['machine']['load_average']
    table = out.with_suffix('.md').read_text()
    assert table in capsys.readouterr().out
    assert '| ViT-S + CBT | train | 48 x 80 (16) |' in table
    assert out.with_suffix('.png').read_bytes()[:4] == b'\x89PNG'


def test_a_run_over_budget_is_killed_and_larger_sizes_not_run():
    result = benchmark_scaling.main([
        '--heads', 'cbt', '--modes', 'inference', '--models', 'mmseg',
        '--sizes', '512x512', '1024x1024', '--time-budget', '0.001',
        '--cfg-options', *SHRINK
    ])
    first, second = result['records']
    assert first['status'] == 'did not finish'
    assert second['status'] == 'not run: a smaller size did not finish'
    assert 'best_s' not in first and 'best_s' not in second


def test_table_reports_failures_and_ratios_without_extrapolating():
    def rec(model, status='ok', **values):
        return dict(head='cbt', mode='inference', model=model,
                    size=[64, 64], tokens=17, status=status, **values)

    result = dict(
        args=dict(heads=['cbt'], modes=['inference'], sizes=[[64, 64]],
                  time_budget=60.0, memory_limit_gib=12.0),
        records=[
            rec('mita', best_s=1.0, peak_bytes=2**20),
            rec('sdpa', best_s=4.0, peak_bytes=2**21),
            rec('mmseg', 'out of memory')
        ])
    row = benchmark_scaling.markdown_table(result).splitlines()[-1]
    cells = [c.strip() for c in row.strip('|').split('|')]
    assert cells[3:8] == ['1.00', '4.00', 'OOM (> 12 GiB)', '0.250', '-']
    assert cells[8:] == ['1', '2', 'OOM (> 12 GiB)', '0.500', '-']


def test_sizes_are_parsed():
    assert benchmark_scaling.parse_args(['--sizes', '1024x2048']).sizes == [
        (1024, 2048)
    ]
    with pytest.raises(SystemExit):
        benchmark_scaling.parse_args(['--sizes', '1024'])


def test_targets_first_then_size_by_size():
    args = benchmark_scaling.parse_args(
        ['--sizes', '32x32', '64x64', '--models', 'mita', 'sdpa'])
    order = [(s, h[0], h[1], h[2])
             for s, h in benchmark_scaling.measurement_order(args)]
    first = [((32, 32), 'cbt', 'inference', 'mita'),
             ((64, 64), 'cbt', 'inference', 'mita'),
             ((32, 32), 'cbt', 'inference', 'sdpa'),
             ((64, 64), 'cbt', 'inference', 'sdpa')]
    assert order[:4] == first
    rest = order[4:]
    assert len(rest) == 2 * 3 * 2  # sizes x other (head, mode) x models
    assert [s for s, *_ in rest] == [(32, 32)] * 6 + [(64, 64)] * 6
