"""The subcommand ``scaling``: workers, budgets, table, plot (tiny
sizes)."""
import argparse
import json

import pytest

from mmseg_mita.bench.cli import main
from mmseg_mita.bench.scaling import measurement_order, table

pytest.importorskip('mmseg')
SHRINK = [
    'model.backbone.num_layers=2', 'model.backbone.embed_dims=64',
    'model.backbone.num_heads=2', 'model.decode_head.in_channels=64',
    'model.decode_head.head_dims=16'
]


def test_measures_every_model_and_writes_json_table_plot(tmp_path, capsys):
    out = tmp_path / 'scaling'
    assert main([
        'scaling', '--heads', 'cbt', '--modes', 'inference', 'train',
        '--sizes', '32x32', '48x80', '--time-budget', '120', '--cfg-options',
        *SHRINK, '--json', f'{out}.json', '--markdown', f'{out}.md',
        '--plot', f'{out}.png'
    ]) == 0
    saved = json.loads(out.with_suffix('.json').read_text())
    rows = saved['rows']
    assert len(rows) == 2 * 3 * 2  # modes x models x sizes
    for r in rows:
        assert r['status'] == 'ok', r
        assert r['best_s'] > 0 and r['peak_bytes'] > 0
        assert len(r['load_before']) == len(r['load_after']) == 3
    assert {r['tokens'] for r in rows} == {5, 16}  # 2x2+1, 3x5+1
    assert saved['machine']['load_average']
    markdown = out.with_suffix('.md').read_text()
    assert '| ViT-S/16 + CBT | train | 48 x 80 (16) |' in markdown
    assert 'ViT-S/16 + CBT | train     | 48 x 80 (16)' in (
        capsys.readouterr().out)
    assert out.with_suffix('.png').read_bytes()[:4] == b'\x89PNG'


def test_a_run_over_budget_is_killed_and_larger_sizes_not_run(tmp_path):
    path = tmp_path / 's.json'
    main(['scaling', '--heads', 'cbt', '--modes', 'inference', '--models',
          'mmseg', '--sizes', '512x512', '1024x1024', '--time-budget',
          '0.001', '--cfg-options', *SHRINK, '--json', str(path)])
    first, second = json.loads(path.read_text())['rows']
    assert first['status'] == 'did not finish'
    assert second['status'] == 'not run: a smaller size did not finish'
    assert 'best_s' not in first and 'best_s' not in second


def test_table_reports_failures_and_ratios_without_extrapolating():
    def row(model, status='ok', **values):
        return dict(head='cbt', mode='inference', model=model,
                    size=[64, 64], tokens=17, status=status, **values)

    doc = dict(
        settings=dict(heads=['cbt'], modes=['inference'], sizes=[[64, 64]],
                      time_budget=60.0, memory_limit_gib=12.0),
        rows=[
            row('mita', best_s=1.0, peak_bytes=2**20),
            row('sdpa', best_s=4.0, peak_bytes=2**21),
            row('mmseg', 'out of memory')
        ])
    line = table(doc, True).splitlines()[-1]
    cells = [c.strip() for c in line.strip('|').split('|')]
    assert cells[3:8] == ['1.00', '4.00', 'OOM (> 12 GiB)', '0.250', '-']
    assert cells[8:] == ['1', '2', 'OOM (> 12 GiB)', '0.500', '-']


def test_sizes_are_parsed(capsys):
    with pytest.raises(SystemExit):
        main(['scaling', '--sizes', '1024'])
    assert 'expected an image size HxW' in capsys.readouterr().err


def test_targets_first_then_size_by_size():
    args = argparse.Namespace(heads=['cbt', 'upernet'],
                              modes=['inference', 'train'],
                              models=['mita', 'sdpa'],
                              sizes=[(32, 32), (64, 64)])
    order = [(s, *key) for s, key in measurement_order(args)]
    first = [((32, 32), 'cbt', 'inference', 'mita'),
             ((64, 64), 'cbt', 'inference', 'mita'),
             ((32, 32), 'cbt', 'inference', 'sdpa'),
             ((64, 64), 'cbt', 'inference', 'sdpa')]
    assert order[:4] == first
    rest = order[4:]
    assert len(rest) == 2 * 3 * 2  # sizes x other (head, mode) x models
    assert [s for s, *_ in rest] == [(32, 32)] * 6 + [(64, 64)] * 6
