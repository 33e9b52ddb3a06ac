"""Timing and peak memory (mmseg_mita.bench.measure) and the subcommand
``op`` at tiny sizes."""
import json

import pytest
import torch

from mmseg_mita.bench.cli import main
from mmseg_mita.bench.measure import (peak_memory, tensor_bytes,
                                      time_interleaved)

CPU = torch.device('cpu')
TINY = ['--heads', '2', '--head-dim', '8', '--pool-size', '2', '--topk',
        '3', '--backends', 'torch']


def test_cpu_peak_memory_counts_what_the_call_allocates():
    kept = torch.ones(2000, 1000)  # allocated before: not counted

    def work():
        big = torch.empty(1000, 1000)  # 4 MB, freed before the next
        del big
        small = torch.empty(500, 1000)  # 2 MB
        return small + kept[:500]  # another 2 MB: 4 MB at the peak

    peak = peak_memory(work, CPU)
    assert 4_000_000 <= peak < 4_100_000


def test_tensor_bytes_counts_each_storage_once():
    a = torch.zeros(10, 100)  # 4000 bytes
    assert tensor_bytes([a, a[2:], a.t(), torch.zeros(3, dtype=torch.int64),
                         'not a tensor']) == 4000 + 24


def test_time_interleaved_stops_repeating_past_the_budget():
    calls = []
    times = time_interleaved({'a': lambda: calls.append('a'),
                              'b': lambda: calls.append('b')},
                             CPU, repeats=3, budget_s=0.0)
    assert calls == ['a', 'b']  # each ran once, the budget was spent
    assert [len(t) for t in times.values()] == [1, 1]
    times = time_interleaved({'a': lambda: calls.append('a')}, CPU,
                             repeats=3, budget_s=5.0, done={'a': [9.0]})
    assert times == {'a': [9.0]} and calls == ['a', 'b']  # already timed


def test_op_writes_rows_table_markdown_and_plot(tmp_path, capsys):
    out = tmp_path / 'r'
    assert main(['op', '--tokens', '17', '26', '--repeats', '2',
                 '--single-head-from', '26', '--json', f'{out}.json',
                 '--markdown', f'{out}.md', '--plot', f'{out}.png'] +
                TINY) == 0
    table = capsys.readouterr().out
    assert '17 |     2 | mita_torch | forward ' in table
    assert '26 |     1 | sdpa       | forward_backward' in table
    rows = json.loads(out.with_suffix('.json').read_text())['rows']
    assert [(r['tokens'], r['method'], r['mode']) for r in rows[:4]] == [
        (17, 'mita_torch', 'forward'), (17, 'mita_torch', 'forward_backward'),
        (17, 'sdpa', 'forward'), (17, 'sdpa', 'forward_backward')]
    assert len(rows) == 8
    for r in rows:
        assert r['runs'] == 2 and r['best_s'] > 0 and r['peak_bytes'] > 0
        sdpa = next(s for s in rows if (s['tokens'], s['method'],
                                        s['mode']) == (r['tokens'], 'sdpa',
                                                       r['mode']))
        assert r['speedup_vs_sdpa'] == pytest.approx(sdpa['best_s'] /
                                                     r['best_s'])
    assert rows[0]['grid'] == [4, 4] and rows[-1]['grid'] == [5, 5]
    assert out.with_suffix('.md').read_text().startswith('| N | B x H |')
    assert out.with_suffix('.png').read_bytes()[:4] == b'\x89PNG'


def test_op_times_several_experts_per_query_against_one(tmp_path):
    path = tmp_path / 'r.json'
    main(['op', '--tokens', '17', '--repeats', '1', '--experts-per-query',
          '2', '--json', str(path)] + TINY)
    rows = json.loads(path.read_text())['rows']
    multi = [r for r in rows if r['method'] == 'mita_s2']
    assert [r['mode'] for r in multi] == ['forward', 'forward_backward']
    for r in multi:
        one = next(s for s in rows if (s['method'], s['mode']) == (
            'mita_torch', r['mode']))
        assert r['keys_ratio'] == pytest.approx((4 + 2 * 3) / (4 + 3))
        assert r['time_vs_one_expert'] == pytest.approx(r['best_s'] /
                                                        one['best_s'])


def test_op_refuses_more_experts_than_landmarks(capsys):
    with pytest.raises(SystemExit):
        main(['op', '--pool-size', '2', '--experts-per-query', '5'])
    assert 'at most the number of experts' in capsys.readouterr().err
