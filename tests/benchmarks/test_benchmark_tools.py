"""The benchmark helpers and tools/benchmark_{attention,backbone}.py."""
import json
import os.path as osp

import pytest
import torch

from mmseg_mita.benchmarks import peak_memory, time_interleaved

CPU = torch.device('cpu')


def test_cpu_peak_memory_counts_what_the_call_allocates():
    kept = torch.ones(2000, 1000)  # allocated before: not counted

    def work():
        big = torch.empty(1000, 1000)  # 4 MB, freed before the next
        del big
        small = torch.empty(500, 1000)  # 2 MB
        return small + kept[:500]  # another 2 MB: 4 MB at the peak

    peak = peak_memory(work, CPU)
    assert 4_000_000 <= peak < 4_100_000


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


def test_benchmark_attention_writes_table_json_and_plot(tmp_path, capsys):
    import benchmark_attention
    out_json, out_png = tmp_path / 'r.json', tmp_path / 'r.png'
    result = benchmark_attention.main([
        '--tokens', '17', '26', '--heads', '2', '--head-dim', '8',
        '--pool-size', '2', '--topk', '3', '--repeats', '2',
        '--single-head-from', '26', '--json', str(out_json),
        '--plot', str(out_png)
    ])
    table = capsys.readouterr().out
    assert '    17    2 |' in table and '    26    1 |' in table
    saved = json.loads(out_json.read_text())
    assert saved['results'] == json.loads(json.dumps(result['results']))
    record = saved['results'][0]
    assert record['grid'] == [4, 4] and record['landmarks'] == 4
    for method in ('mita', 'sdpa'):
        for mode in ('forward', 'forward_backward'):
            stats = record[method][mode]
            assert stats['runs'] == 2 and stats['best_s'] > 0
            assert stats['peak_bytes'] > 0
    assert out_png.read_bytes()[:4] == b'\x89PNG'


def test_benchmark_attention_rejects_tokens_without_a_square_grid():
    import benchmark_attention
    with pytest.raises(SystemExit, match='square grid'):
        benchmark_attention.parse_args(['--tokens', '30'])


def test_benchmark_backbone_compares_with_sdpa_and_mmseg_vit(
        tmp_path, repo_root, capsys):
    pytest.importorskip('mmseg')
    import benchmark_backbone
    config = osp.join(repo_root, 'configs/mita_vit/'
                      'mita-vit-mini8_upernet_1xb8-1k_demo-96x96.py')
    result = benchmark_backbone.main([
        config, '--size', '32', '32', '--repeats', '1', '--train',
        '--json', str(tmp_path / 'b.json')
    ])
    assert set(result['results']) == {'mita', 'sdpa', 'mmseg'}
    for stats in result['results'].values():
        assert stats['images_per_s'] > 0 and stats['peak_bytes'] > 0
    assert set(result['time_ratio']) == set(result['memory_ratio']) == {
        'sdpa', 'mmseg'}
    table = capsys.readouterr().out
    assert 'SDPA twin' in table and "mmseg's ViT" in table
    configs = benchmark_backbone.load_configs(
        benchmark_backbone.parse_args([config]))
    sdpa = configs['sdpa'].model.backbone
    mmseg = configs['mmseg'].model.backbone
    assert (sdpa.type, sdpa.mita_cfg, sdpa.full_attention) == ('MiTAViT', None,
                                                              'sdpa')
    assert mmseg.type == 'VisionTransformer'
    assert 'mita_cfg' not in mmseg and 'full_attention' not in mmseg
    assert json.loads((tmp_path / 'b.json').read_text())['input_size'] == [
        32, 32
    ]


def test_benchmark_backbone_refuses_a_full_attention_config(repo_root):
    pytest.importorskip('mmseg')
    import benchmark_backbone
    config = osp.join(repo_root, 'configs/mita_vit/'
                      'vit-mini8_upernet_1xb8-1k_demo-96x96.py')
    with pytest.raises(SystemExit, match='not a MiTA model'):
        benchmark_backbone.load_configs(
            benchmark_backbone.parse_args([config]))
