"""The benchmark models (mmseg_mita.bench.models) and the subcommands
``encoder`` and ``op-shapes`` at tiny sizes on CPU."""
import json

import pytest
import torch

from mmseg_mita.bench.cli import main
from mmseg_mita.bench.models import ViTEncoder, mita_attend, sdpa_attention


def _tiny():
    torch.manual_seed(0)
    return ViTEncoder(dim=16, depth=2, heads=2, mlp_ratio=4, patch=4,
                      pos_grid=(4, 4))


@pytest.mark.parametrize('attend', [sdpa_attention, mita_attend('torch', 2,
                                                                3)])
def test_encoder_runs_forward_and_backward(attend):
    model = _tiny()
    calls = []

    def recording(q, k, v, hw):
        calls.append((tuple(q.shape), hw))
        return attend(q, k, v, hw)

    images = torch.randn(2, 3, 16, 20)  # a 4 x 5 patch grid: pos resized
    out = model(images, recording)
    assert out.shape == (2, 1 + 4 * 5, 16)
    out.square().mean().backward()
    assert calls == [((2, 2, 21, 8), (4, 5))] * 2  # every layer, cls first
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_mita_encoder_differs_from_sdpa_and_has_vit_s_defaults():
    model = _tiny()
    images = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        full = model(images, sdpa_attention)
        mita = model(images, mita_attend('torch', 2, 3))
    assert not torch.allclose(full, mita)  # 3 of 17 keys: not attention
    vit_s = ViTEncoder()
    assert len(vit_s.blocks) == 12 and vit_s.blocks[0].heads == 6
    assert vit_s.patch_embed.out_channels == 384
    assert vit_s.patch_embed.kernel_size == (16, 16)
    assert vit_s.blocks[0].mlp[0].out_features == 4 * 384
    assert vit_s.pos_embed.shape == (1, 1 + 32 * 32, 384)


def test_encoder_tiny_run(tmp_path, capsys):
    out = tmp_path / 'e.json'
    assert main([
        'encoder', '--device', 'cpu', '--dtype', 'float32', '--settings',
        'train:16x16:2', 'infer:16x20:1', '--backends', 'torch', '--modes',
        'eager', '--dim', '16', '--depth', '1', '--heads', '2', '--patch',
        '4', '--pool-size', '2', '--topk', '3', '--repeats', '1', '--json',
        str(out)
    ]) == 0
    assert 'x SDPA time' in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved['model']['head_dim'] == 8
    rows = saved['rows']
    assert [(r['setting'], r['method'], r['tokens']) for r in rows] == [
        ('train:16x16:2', 'sdpa', 17), ('train:16x16:2', 'mita_torch', 17),
        ('infer:16x20:1', 'sdpa', 21), ('infer:16x20:1', 'mita_torch', 21)]
    for r in rows:
        assert r['best_s'] > 0 and r['peak_bytes'] > 0 and 'error' not in r
        assert r['time_ratio'] > 0


@pytest.mark.parametrize('argv, message', [
    (['--settings', 'fit:16x16:2'], 'expected train|infer:HxW:BATCH'),
    (['--settings', 'train:18x16:2', '--patch', '4'],
     'multiples of --patch 4'),
    (['--dim', '30', '--heads', '4'], 'multiple of --heads 4'),
])
def test_encoder_refuses_bad_settings(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(['encoder', '--device', 'cpu', '--dtype', 'float32'] + argv)
    assert message in capsys.readouterr().err


def test_op_shapes_records_a_failed_mode_and_the_others(tmp_path):
    path = tmp_path / 'o.json'
    main(['op-shapes', '--device', 'cpu', '--dtype', 'float32', '--shapes',
          '17:2', '--head-dim', '8', '--pool-size', '2', '--topk', '3',
          '--backends', 'torch', '--modes', 'cudagraph', 'compiled',
          '--compile-backend', 'eager', '--repeats', '1', '--min-run-ms',
          '0', '--json', str(path)])
    rows = {(r['method'], r['mode']): r
            for r in json.loads(path.read_text())['rows']}
    assert set(rows) == {(m, g) for m in ('sdpa', 'mita_torch')
                         for g in ('eager', 'cudagraph', 'compiled')}
    assert rows[('mita_torch', 'eager')]['grid'] == [4, 4]
    assert rows[('mita_torch', 'eager')]['speedup_vs_sdpa'] > 0
    assert 'CUDA' in rows[('mita_torch', 'cudagraph')]['error']
    compiled = rows[('mita_torch', 'compiled')]
    assert compiled['graph_breaks'] == 0
    assert compiled['rel_err_vs_eager'] < 1e-5
