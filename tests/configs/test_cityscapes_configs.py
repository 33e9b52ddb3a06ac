"""Every Cityscapes config builds (no pretrained weights) and runs on CPU."""
import argparse
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config, DictAction

import mmseg_mita.mmseg_plugin  # noqa: F401  (MiTA in mmseg)
from helpers import build_segmentor, infer, scheduled_end

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SIZES = dict(s16=(384, 6), b16=(768, 12))
HEADS = ('cbt', 'upernet')
MATRIX = [
    f'{attn}vit-{size}_{head}_8xb1-80k_cityscapes-1024x1024.py'
    for head in HEADS for size in SIZES for attn in ('', 'mita-')
]
MITA_CFG = dict(pool_size=7, topk=49, layers='all', backend='auto')
# The slide inference documented in the configs' header.
SLIDE_OPTIONS = [
    'model.test_cfg.mode=slide', 'model.test_cfg.crop_size=(1024,1024)',
    'model.test_cfg.stride=(768,768)'
]


def _cfg(name):
    return Config.fromfile(osp.join(ROOT, 'configs', 'mita_vit', name))


def test_matrix_is_complete():
    found = {
        osp.basename(p)
        for p in glob.glob(osp.join(ROOT, 'configs/mita_vit/*cityscapes*.py'))
    }
    assert found == set(MATRIX)


@pytest.mark.parametrize('name', MATRIX)
def test_builds_and_runs(name):
    model = build_segmentor(_cfg(name).model)
    size = (64, 96)
    logits = infer(model, size)
    assert logits.shape == (1, 19, *size)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize('name', [n for n in MATRIX if n.startswith('mita')])
def test_mita_config_differs_from_its_sdpa_twin_by_attention_only(name):
    mita, full = _cfg(name).to_dict(), _cfg(name[len('mita-'):]).to_dict()
    mita_backbone, full_backbone = (c['model'].pop('backbone')
                                    for c in (mita, full))
    assert mita.pop('mita_cfg') == MITA_CFG  # ../_base_/models/mita-vit.py
    assert mita == full
    assert full_backbone.pop('mita_cfg') is None
    assert mita_backbone.pop('mita_cfg') == MITA_CFG
    assert mita_backbone == full_backbone
    assert (full_backbone['type'], full_backbone['full_attention']) == (
        'MiTAViT', 'sdpa')


@pytest.mark.parametrize('name', [n for n in MATRIX if n.startswith('vit')])
def test_recipe(name):
    cfg = _cfg(name)
    size = name.split('_')[0][len('vit-'):]
    backbone = cfg.model.backbone
    assert (backbone.embed_dims, backbone.num_heads) == SIZES[size]
    assert backbone.init_cfg.checkpoint == \
        f'pretrain/vit-{size}_augreg-384_mmseg.pth'
    assert cfg.crop_size == (1024, 1024) == tuple(
        cfg.model.data_preprocessor.size) == tuple(backbone.img_size)
    assert cfg.train_dataloader.dataset.type == 'CityscapesDataset'
    crops = [t['crop_size'] for t in cfg.train_dataloader.dataset.pipeline
             if t['type'] == 'RandomCrop']
    assert crops == [(1024, 1024)]
    resize = [t for t in cfg.test_pipeline if t['type'] == 'Resize']
    assert [(r['scale'], r['keep_ratio']) for r in resize] == [
        ((2048, 1024), True)]
    assert cfg.model.decode_head.num_classes == 19
    assert cfg.model.test_cfg == dict(mode='whole')
    assert cfg.train_cfg.max_iters == 80000
    assert cfg.train_dataloader.batch_size == 1  # x 8 GPUs
    optimizer = cfg.optim_wrapper.optimizer
    poly = cfg.param_scheduler[-1]
    assert poly.type == 'PolyLR' and scheduled_end(cfg, poly) == 80000
    if '_cbt_' in name:
        assert (optimizer.type, optimizer.lr, optimizer.momentum,
                optimizer.weight_decay) == ('SGD', 1e-3, 0.9, 0.0)
        assert poly.power == 0.9
    else:
        assert cfg.model.auxiliary_head.num_classes == 19
        assert (optimizer.type, optimizer.lr,
                optimizer.weight_decay) == ('AdamW', 6e-5, 0.01)
        assert cfg.param_scheduler[0].type == 'LinearLR'


def test_slide_inference_through_cfg_options():
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    cfg = _cfg('mita-vit-s16_cbt_8xb1-80k_cityscapes-1024x1024.py')
    cfg.merge_from_dict(
        parser.parse_args(['--cfg-options'] + SLIDE_OPTIONS).cfg_options)
    assert cfg.model.test_cfg == dict(mode='slide', crop_size=(1024, 1024),
                                      stride=(768, 768))
    # what the header documents is what is tested here
    header = open(osp.join(ROOT, 'configs/mita_vit',
                           'vit-s16_cbt_8xb1-80k_cityscapes-1024x1024.py'))
    text = header.read().replace('#', ' ')
    assert all(f"'{o}'" in text or o in text for o in SLIDE_OPTIONS)
    cfg.model.backbone.update(num_layers=2, embed_dims=64, num_heads=2)
    cfg.model.decode_head.update(in_channels=64, head_dims=16)
    cfg.model.test_cfg.update(crop_size=(48, 48), stride=(32, 32))
    model = build_segmentor(cfg.model)
    size = (64, 112)
    assert infer(model, size).shape == (1, 19, *size)
