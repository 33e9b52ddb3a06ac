"""Every ADE20K config builds (no pretrained weights) and runs on CPU."""
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config

import mmseg_mita.mmseg_plugin  # noqa: F401  (MiTA in mmseg)
from helpers import build_segmentor, infer, scheduled_end

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SIZES = dict(t16=(192, 3, 12), s16=(384, 6, 12), b16=(768, 12, 12),
             l16=(1024, 16, 24))
RECIPES = dict(cbt='8xb1', upernet='8xb2')


def _name(attn, size, head):
    res = '640x640' if size == 'l16' else '512x512'
    return (f'{attn}vit-{size}_{head}_{RECIPES[head]}-160k_ade20k-{res}.py')


MATRIX = [
    _name(attn, size, head) for head in RECIPES for size in SIZES
    for attn in ('', 'mita-')
]


def _cfg(name):
    return Config.fromfile(osp.join(ROOT, 'configs', 'mita_vit', name))


def _run_inference(model_cfg, size=112):
    """One inference on a ``size`` x ``size`` image, pretrained off."""
    return infer(build_segmentor(model_cfg), (size, size))


def test_matrix_is_complete():
    found = {
        osp.basename(p)
        for p in glob.glob(osp.join(ROOT, 'configs/mita_vit/*ade20k*.py'))
        if not osp.basename(p).startswith('mita-deit')  # own tests
    }
    assert found == set(MATRIX)


@pytest.mark.parametrize('name', MATRIX)
def test_builds_and_runs(name):
    cfg = _cfg(name)
    logits = _run_inference(cfg.model)
    assert logits.shape == (1, 150, 112, 112)
    assert torch.isfinite(logits).all()


MITA_BASE = osp.join(ROOT, 'configs/_base_/models/mita-vit.py')


def _base_mita_cfg():
    """The base's mita_cfg without ``_delete_`` (which makes it replace
    the twin's ``mita_cfg=None``)."""
    cfg = Config.fromfile(MITA_BASE).to_dict()['mita_cfg']
    assert cfg.pop('_delete_') is True
    return cfg


def test_mita_base_is_the_paper_setting():
    assert _base_mita_cfg() == dict(pool_size=7, topk=49, layers='all',
                                    backend='auto')


@pytest.mark.parametrize(
    'name',
    [n for n in MATRIX if n.startswith('mita')] +
    ['mita-vit-mini8_upernet_1xb8-1k_demo-96x96.py'])
def test_mita_configs_take_mita_cfg_from_the_base(name):
    """No MiTA leaf config writes the setting out: it comes from
    _base_/models/mita-vit.py (the demo changes m and k only)."""
    text = open(osp.join(ROOT, 'configs', 'mita_vit', name)).read()
    assert "'../_base_/models/mita-vit.py'" in text
    assert 'layers=' not in text and 'backend=' not in text
    cfg = _cfg(name)
    assert cfg.model.backbone.mita_cfg == cfg.mita_cfg


@pytest.mark.parametrize('name', [n for n in MATRIX if n.startswith('mita')])
def test_mita_config_differs_from_its_twin_by_attention_only(name):
    mita, full = _cfg(name).to_dict(), _cfg(name[len('mita-'):]).to_dict()
    mita_backbone, full_backbone = (c['model'].pop('backbone')
                                    for c in (mita, full))
    mita_cfg = mita.pop('mita_cfg')  # the base's variable
    assert mita == full
    assert full_backbone.pop('mita_cfg') is None  # full attention by SDPA
    assert mita_backbone.pop('mita_cfg') == mita_cfg == _base_mita_cfg()
    assert mita_backbone == full_backbone
    assert (full_backbone['type'], full_backbone['full_attention']) == (
        'MiTAViT', 'sdpa')


@pytest.mark.parametrize('name', [n for n in MATRIX if n.startswith('vit')])
def test_backbone_matches_timm_checkpoints(name):
    size = name.split('_')[0][len('vit-'):]
    backbone = _cfg(name).model.backbone
    dims, heads, layers = SIZES[size]
    assert (backbone.embed_dims, backbone.num_heads,
            backbone.num_layers) == (dims, heads, layers)
    assert backbone.patch_size == 16
    assert backbone.patch_bias and backbone.final_norm
    assert backbone.norm_cfg == dict(type='LN', eps=1e-6)
    assert backbone.init_cfg == dict(
        type='Pretrained',
        checkpoint=f'pretrain/vit-{size}_augreg-384_mmseg.pth')
    # timm's AugReg ViTs take inputs scaled to [-1, 1]
    preprocessor = _cfg(name).model.data_preprocessor
    assert preprocessor.mean == preprocessor.std == [127.5] * 3


@pytest.mark.parametrize('name', [n for n in MATRIX if n.startswith('vit')])
def test_recipe(name):
    cfg = _cfg(name)
    crop = (640, 640) if 'l16' in name else (512, 512)
    assert cfg.crop_size == crop == tuple(cfg.model.data_preprocessor.size)
    assert tuple(cfg.model.backbone.img_size) == crop
    crops = [t['crop_size'] for t in cfg.train_dataloader.dataset.pipeline
             if t['type'] == 'RandomCrop']
    assert crops == [crop]
    assert cfg.train_cfg.max_iters == 160000
    optimizer = cfg.optim_wrapper.optimizer
    poly = cfg.param_scheduler[-1]
    assert poly.type == 'PolyLR' and scheduled_end(cfg, poly) == 160000
    if '_cbt_' in name:
        assert cfg.train_dataloader.batch_size == 1  # x 8 GPUs
        assert (optimizer.type, optimizer.lr, optimizer.momentum,
                optimizer.weight_decay) == ('SGD', 1e-3, 0.9, 0.0)
        assert poly.power == 0.9 and len(cfg.param_scheduler) == 1
    else:
        assert cfg.train_dataloader.batch_size == 2  # x 8 GPUs
        assert (optimizer.type, optimizer.lr,
                optimizer.weight_decay) == ('AdamW', 6e-5, 0.01)
        assert cfg.param_scheduler[0].type == 'LinearLR'
    if 'l16' in name:
        assert cfg.model.test_cfg == dict(
            mode='slide', crop_size=(640, 640), stride=(608, 608))
    else:
        assert cfg.model.test_cfg.mode == 'whole'
