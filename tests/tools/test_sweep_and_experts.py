"""tools/sweep_mk.py, tools/show_experts.py and swapping the attention of a
checkpoint at test time (tools/test.py --cfg-options)."""
import dataclasses
import json
import os.path as osp
import re
import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from mmseg_mita.analysis.show_experts import main as show_main
from mmseg_mita.analysis.show_experts import (pooling_cells,
                                              selection_frequency)
from mmseg_mita.analysis.sweep_mk import format_grid
from mmseg_mita.analysis.sweep_mk import main as sweep_main
from mmseg_mita.analysis.sweep_mk import training_setting

FULL = 'configs/mita_vit/vit-mini8_upernet_1xb8-1k_demo-96x96.py'
MITA = 'configs/mita_vit/mita-vit-mini8_upernet_1xb8-1k_demo-96x96.py'


def _data_opts(data_root):
    opts = []
    for split in ('val', 'test'):
        opts += [f'{split}_dataloader.dataset.data_root={data_root}',
                 f'{split}_dataloader.num_workers=0',
                 f'{split}_dataloader.persistent_workers=False']
    return opts


def _run(repo_root, args):
    proc = subprocess.run([sys.executable] + args, cwd=repo_root,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc.stdout


@pytest.fixture(scope='module')
def full_attention_ckpt(repo_root, tmp_path_factory):
    """A randomly initialised full-attention (mmseg VisionTransformer)
    segmentor, saved as mmengine saves checkpoints."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.runner import save_checkpoint
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    torch.manual_seed(0)
    model = MODELS.build(Config.fromfile(osp.join(repo_root, FULL)).model)
    model.init_weights()
    path = str(tmp_path_factory.mktemp('ckpt') / 'full.pth')
    save_checkpoint({'meta': {}, 'state_dict': model.state_dict()}, path)
    return path


@pytest.mark.parametrize('s', [1, 2])
def test_selection_frequency_counts_queries_per_key(s):
    # s experts per query: expert [G, N] for one, [G, N, s] for several.
    torch.manual_seed(s)
    g, n, m, k = 3, 11, 4, 5
    expert = torch.stack([
        torch.stack([torch.randperm(m)[:s] for _ in range(n)])
        for _ in range(g)
    ])
    topk_index = torch.stack([
        torch.stack([torch.randperm(n)[:k] for _ in range(m)])
        for _ in range(g)
    ])
    freq = selection_frequency(expert[..., 0] if s == 1 else expert,
                               topk_index, m)
    for gi in range(g):
        for t in range(n):
            hits = sum(t in topk_index[gi, e].tolist()
                       for i in range(n) for e in expert[gi, i].tolist())
            assert freq[gi, t].item() == pytest.approx(hits / n)
    # every query gathers s k keys (a key of two of its experts twice)
    torch.testing.assert_close(freq.sum(1), torch.full((g, ), float(s * k),
                                                       dtype=torch.float64))


@pytest.mark.parametrize('size,bins', [(12, 4), (12, 5), (7, 3), (5, 5)])
def test_pooling_cells_are_those_of_adaptive_avg_pool(size, bins):
    weights = F.adaptive_avg_pool1d(torch.eye(size)[None], bins)[0]
    cells = [tuple(int(i) for i in col.nonzero()[[0, -1], 0]) for col in
             weights.T]
    assert [(a, b - 1) for a, b in pooling_cells(size, bins)] == cells


def test_show_experts_draws_every_mita_layer(repo_root, demo_data,
                                             full_attention_ckpt, tmp_path):
    image = osp.join(demo_data, 'images', 'validation',
                     'demo_validation_00000.jpg')
    config = osp.join(repo_root, FULL)
    with pytest.raises(SystemExit, match='full attention; pass'):
        show_main([config, full_attention_ckpt, image, '--out',
                   str(tmp_path)])
    out = tmp_path / 'experts'
    show_main([config, full_attention_ckpt, image, '--out', str(out),
               '--pool-size', '3', '--topk', '9', '--cfg-options',
               # the twin's mita_cfg is None: replace it, not merge into it
               'model.backbone.mita_cfg._delete_=True',
               'model.backbone.mita_cfg.layers=[1,3]'])
    names = sorted(p.name for p in out.iterdir())
    assert names == ['all_layers.png', 'layer1.png', 'layer3.png']
    for name in names:
        assert (out / name).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_training_setting_and_grid_marks():
    assert training_setting(dict(type='VisionTransformer')) is None
    assert training_setting(dict(type='MiTAViT', mita_cfg=None)) is None
    assert training_setting(dict(type='MiTAViT')) == ('MiTA', 7, 49)
    assert training_setting(dict(type='MiTAViT',
                                 mita_cfg=dict(pool_size=4, topk=16))) == \
        ('MiTA', 4, 16)
    assert training_setting(dict(
        type='MiTAViT', mita_cfg=dict(experts_per_query=2,
                                      shared_expert=False))) == \
        ('routing-only s=2', 7, 49)
    assert training_setting(dict(
        type='MiTAViT', mita_cfg=dict(routed_experts=False))) == \
        ('compression-only', 7, None)
    results = {'full': 50.0, 'mita': {'MiTA': {'4,16': 40.0, '4,9': 30.0},
                                      'compression-only': {'4': 20.0}}}
    text = format_grid(results, [4, 13], [9, 16], ('MiTA', 4, 16))
    lines = text.splitlines()
    assert lines[1:3] == ['MiTA:', 'm \\ k              9       16 ']
    assert '16 (4x4)       30.00    40.00*' in text
    assert 'skipped' in lines[4]
    assert lines[5:7] == ['compression-only:',
                          'm \\ k          any k ']
    assert lines[7] == '16 (4x4)       20.00 '
    text = format_grid(results, [4], [9, 16], ('compression-only', 4, None))
    assert text.splitlines()[-1] == '16 (4x4)       20.00*'


def test_sweep_variants():
    from mmseg_mita.analysis.sweep_mk import variants
    assert variants([1, 2], False) == [('MiTA', dict(experts_per_query=1)),
                                       ('MiTA s=2', dict(experts_per_query=2))]
    assert [name for name, _ in variants([1, 3], True)] == [
        'MiTA', 'MiTA s=3', 'routing-only', 'routing-only s=3',
        'compression-only']


class _RecordingRunner:
    """Stands in for mmengine's Runner: ``test()`` runs the backbone on one
    image and returns an mIoU that names the MiTA setting it ran with."""

    def __init__(self):
        from mmseg_mita.models import MiTAViT
        self.model = types.SimpleNamespace(backbone=MiTAViT(
            img_size=(48, 48), patch_size=8, embed_dims=16, num_layers=2,
            num_heads=2, mita_cfg=None))
        self.settings = []

    def test(self):
        backbone = self.model.backbone
        backbone(torch.randn(1, 3, 48, 40))  # a 6 x 5 patch grid
        mita = backbone.mita
        self.settings.append(mita and dict(
            dataclasses.asdict(mita.options),
            layers=list(backbone.mita_layers)))
        return {'mIoU': float(len(self.settings))}


def test_sweep_runs_every_variant_that_fits(tmp_path):
    from mmseg_mita.analysis.sweep_mk import plot_heatmap, sweep, variants
    runner = _RecordingRunner()
    kept = dict(layers=[1], landmarks='official')
    results = sweep(runner, [1, 2, 6], [3, 40], kept,
                    variants([1, 2], True), log=lambda text: None)
    assert results['patch_grid'] == [6, 5]
    grids = results['mita']
    assert list(grids) == ['MiTA', 'MiTA s=2', 'routing-only',
                           'routing-only s=2', 'compression-only']
    for name in ('MiTA', 'routing-only'):
        assert list(grids[name]) == ['1,3', '1,40', '2,3', '2,40']
    for name in ('MiTA s=2', 'routing-only s=2'):  # s > m = 1 skipped
        assert list(grids[name]) == ['2,3', '2,40']
    assert list(grids['compression-only']) == ['1', '2']  # no k
    assert runner.settings[0] is None  # full attention first
    assert len(runner.settings) == 1 + 4 + 2 + 4 + 2 + 2
    by_result = {value: runner.settings[int(value) - 1]
                 for grid in grids.values() for value in grid.values()}
    assert by_result[grids['routing-only s=2']['2,40']] == dict(
        pool_size=(2, 2), topk=40, experts_per_query=2, shared_expert=False,
        routed_experts=True, landmarks='official', layers=[1])
    assert by_result[grids['compression-only']['1']] == dict(
        pool_size=(1, 1), topk=49, experts_per_query=1, shared_expert=True,
        routed_experts=False, landmarks='official', layers=[1])
    png = tmp_path / 'sweep.png'
    plot_heatmap(results, [1, 2, 6], [3, 40], ('MiTA s=2', 2, 3), str(png))
    assert png.read_bytes()[:4] == b'\x89PNG'


def test_sweep_and_test_time_swap_agree(repo_root, demo_data,
                                        full_attention_ckpt, tmp_path,
                                        capsys):
    work_dir = str(tmp_path / 'sweep')
    sweep_main([
        osp.join(repo_root, FULL), full_attention_ckpt, '--pool-sizes', '7',
        '13', '--topks', '4', '25', '--work-dir', work_dir,
        '--cfg-options'
    ] + _data_opts(demo_data))
    out = capsys.readouterr().out
    assert 'pool size 13 skipped: larger than the smallest patch grid ' \
        '12x12' in out
    assert re.search(r'full attention: mIoU [0-9.]+  \*', out)
    results = json.load(open(osp.join(work_dir, 'sweep_mk.json')))
    assert sorted(results['mita']) == ['MiTA']
    assert sorted(results['mita']['MiTA']) == ['7,25', '7,4']
    assert results['landmarks'] == 'patches' and results['layers'] == 'all'
    assert results['patch_grid'] == [12, 12] and results['trained'] is None
    with open(osp.join(work_dir, 'sweep_mk.png'), 'rb') as f:
        assert f.read(4) == b'\x89PNG'
    # a full-attention checkpoint evaluated under MiTA by mmseg's test tool
    out = _run(repo_root, [
        'tools/test.py', MITA, full_attention_ckpt, '--work-dir',
        str(tmp_path / 'test'), '--cfg-options',
        'model.backbone.mita_cfg.pool_size=7',
        'model.backbone.mita_cfg.topk=25'
    ] + _data_opts(demo_data))
    assert 'missing keys' not in out and 'unexpected key' not in out
    miou = float(re.findall(r'mIoU: ([0-9.]+)', out)[-1])
    assert miou == pytest.approx(results['mita']['MiTA']['7,25'], abs=0.01)


@pytest.mark.parametrize('config,options,expected', [
    (FULL, ['model.backbone.mita_cfg._delete_=True',
            'model.backbone.mita_cfg.topk=25'],
     dict(pool_size=(7, 7), topk=25)),
    (FULL, ['model.backbone.full_attention=mmcv'], None),
    (MITA, ['model.backbone.mita_cfg.pool_size=3'],
     dict(pool_size=(3, 3), topk=16)),
    (MITA, ['model.backbone.mita_cfg=None'], None),
])
def test_cfg_options_swap_the_attention(repo_root, config, options,
                                        expected):
    """What tools/test.py --cfg-options builds (mmengine's DictAction)."""
    import argparse

    from mmengine.config import Config, DictAction
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    cfg = Config.fromfile(osp.join(repo_root, config))
    cfg.merge_from_dict(parser.parse_args(['--cfg-options'] +
                                          options).cfg_options)
    init_default_scope('mmseg')
    backbone = MODELS.build(cfg.model.backbone)
    for layer in backbone.layers:
        options = layer.attn.mita and layer.attn.mita.options
        got = options and dict(pool_size=options.pool_size,
                               topk=options.topk)
        assert got == expected
