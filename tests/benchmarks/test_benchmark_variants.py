"""tools/benchmark_attention.py --experts-per-query."""
import pytest


def test_benchmark_attention_times_several_experts_against_one(capsys):
    import benchmark_attention
    result = benchmark_attention.main([
        '--tokens', '17', '26', '--heads', '2', '--head-dim', '8',
        '--pool-size', '2', '--topk', '3', '--repeats', '1',
        '--experts-per-query', '2'
    ])
    table = capsys.readouterr().out
    assert 's=1       s=2  ratio' in table
    assert 'keys ratio = (m + 2 k) / (m + k)' in table
    for record in result['results']:
        assert record['experts_per_query'] == 2
        assert record['keys_ratio'] == pytest.approx((4 + 2 * 3) / (4 + 3))
        for mode in ('forward', 'forward_backward'):
            assert record['mita_multi'][mode]['best_s'] > 0
            assert record[f'multi_time_ratio_{mode}'] == pytest.approx(
                record['mita_multi'][mode]['best_s'] /
                record['mita'][mode]['best_s'])


def test_benchmark_attention_without_experts_per_query_measures_two():
    import benchmark_attention
    args = benchmark_attention.parse_args(['--tokens', '17',
                                           '--pool-size', '2'])
    assert benchmark_attention.methods(args) == ['mita', 'sdpa']


def test_benchmark_attention_rejects_more_experts_than_landmarks():
    import benchmark_attention
    with pytest.raises(SystemExit):
        benchmark_attention.parse_args(['--pool-size', '2',
                                        '--experts-per-query', '5'])
