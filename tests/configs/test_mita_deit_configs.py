"""The configs that fine-tune the authors' MiTA-DeiT-S checkpoints on
ADE20K: their settings, and that they build and run (pretrained off)."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config

import mmseg_mita.mmseg_plugin  # noqa: F401  (MiTA in mmseg)
from helpers import build_segmentor, infer

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = {  # config -> (dwc, gate, converted checkpoint)
    'mita-deit-s16_upernet_8xb2-160k_ade20k-512x512.py':
    (False, False, 'pretrain/mita-deit-s16_mmseg.pth'),
    'mita-deit-s16-dwc_upernet_8xb2-160k_ade20k-512x512.py':
    (True, False, 'pretrain/mita-deit-s16-dwc_mmseg.pth'),
    'mita-deit-s16-dwc-gate_upernet_8xb2-160k_ade20k-512x512.py':
    (True, True, 'pretrain/mita-deit-s16-dwc-gate_mmseg.pth'),
}


def _cfg(name):
    return Config.fromfile(osp.join(ROOT, 'configs', 'mita_vit', name))


@pytest.mark.parametrize('name', CONFIGS)
def test_settings_fit_the_authors_deit_s(name):
    dwc, gate, checkpoint = CONFIGS[name]
    cfg = _cfg(name)
    backbone = cfg.model.backbone
    assert backbone.type == 'MiTAViT'
    assert (backbone.embed_dims, backbone.num_heads, backbone.num_layers,
            backbone.patch_size, backbone.mlp_ratio) == (384, 6, 12, 16, 4)
    assert backbone.qkv_bias and backbone.patch_bias and backbone.final_norm
    assert backbone.with_cls_token and backbone.norm_cfg.eps == 1e-6
    assert (backbone.get('dwc', False), backbone.get('gate', False)) == (dwc,
                                                                       gate)
    assert backbone.mita_cfg == dict(pool_size=7, topk=49, layers='all',
                                     backend='auto', landmarks='official')
    assert backbone.init_cfg == dict(type='Pretrained', checkpoint=checkpoint)
    # DeiT normalises with ImageNet's statistics
    assert cfg.model.data_preprocessor.mean == [123.675, 116.28, 103.53]
    assert cfg.model.data_preprocessor.std == [58.395, 57.12, 57.375]
    # otherwise the recipe of the MiTA ViT-S/16 UPerNet config
    recipe = _cfg('mita-vit-s16_upernet_8xb2-160k_ade20k-512x512.py')
    for key in ('optim_wrapper', 'param_scheduler', 'train_dataloader',
                'train_cfg', 'crop_size'):
        assert cfg[key] == recipe[key], key


def _inference(model_cfg, size=112):
    model = build_segmentor(model_cfg)
    logits = infer(model, (size, size))
    assert logits.shape == (1, 150, size, size)
    assert torch.isfinite(logits).all()
    return model


@pytest.mark.parametrize('name', CONFIGS)
def test_builds_and_runs(name):
    dwc, gate, _ = CONFIGS[name]
    model = _inference(_cfg(name).model)
    assert (model.backbone.dwc, model.backbone.gate) == (dwc, gate)
    assert model.backbone.mita.options.landmarks == 'official'
