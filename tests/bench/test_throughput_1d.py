"""The subcommand ``throughput-1d``: settings and one tiny CPU run."""
import argparse
import json

import pytest
import torch

from mmseg_mita.bench.cli import main
from mmseg_mita.bench.models import Transformer1d
from mmseg_mita.bench.throughput_1d import parse_mk, resolve_mk


def test_quarter_setting_puts_m_times_k_near_a_quarter_of_n():
    assert [resolve_mk('quarter', n) for n in (65536, 262144, 1048576)] == [
        128, 256, 512
    ]
    assert resolve_mk(49, 65536) == 49
    assert resolve_mk(49, 20) == 20  # never more than N


@pytest.mark.parametrize('value', ['0', '-3', 'half', '2.5'])
def test_bad_mk_is_rejected(value):
    with pytest.raises(argparse.ArgumentTypeError, match='--mk'):
        parse_mk(value)


def test_dim_must_split_into_heads(capsys):
    with pytest.raises(SystemExit):
        main(['throughput-1d', '--dim', '130', '--heads', '4'])
    assert '--dim 130 must be a multiple of --heads 4' in (
        capsys.readouterr().err)


def test_model_is_pre_norm_with_the_stated_sizes():
    model = Transformer1d(dim=128, depth=3, heads=2, mlp_ratio=4)
    assert len(model.blocks) == 3
    block = model.blocks[0]
    assert block.qkv.out_features == 3 * 128 and block.heads == 2
    assert block.mlp[0].out_features == 4 * 128
    x = torch.randn(1, 10, 128)
    calls = []

    def attend(q, k, v):
        calls.append(q.shape)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    assert model(x, attend).shape == x.shape
    assert calls == [(1, 2, 10, 64)] * 3


def test_tiny_cpu_run_writes_json_and_table(tmp_path, capsys):
    out = tmp_path / 't.json'
    assert main([
        'throughput-1d', '--device', 'cpu', '--dtype', 'float32',
        '--tokens', '64', '100', '--mk', '4', 'quarter', '--backends',
        'torch', '--dim', '16', '--heads', '2', '--depth', '1', '--repeats',
        '1', '--warmup-tokens', '16', '--json', str(out)
    ]) == 0
    table = capsys.readouterr().out
    assert 'tokens/s' in table and 'Error' not in table
    saved = json.loads(out.read_text())
    assert saved['model']['head_dim'] == 8
    rows = [(r['tokens'], r['method'], r['m'], r['k'])
            for r in saved['rows']]
    assert rows == [(64, 'sdpa', None, None), (64, 'mita_torch', 4, 4),
                    (64, 'mita_torch', 4, 4), (100, 'sdpa', None, None),
                    (100, 'mita_torch', 4, 4), (100, 'mita_torch', 5, 5)]
    for r in saved['rows']:
        assert r['tokens_per_s'] > 0 and r['speedup_vs_sdpa'] > 0
