"""Inputs of any shape: fewer landmarks on small grids, segmentations of the
input's size through ``mmseg.apis.inference_model``."""
import os.path as osp

import numpy as np
import pytest
import torch
from mmseg.apis import inference_model, init_model

from mmseg_mita.models import MiTAViT
from mmseg_mita.models.backbones import mita_vit
from mmseg_mita.ops import MiTAOptions, mita_attention

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SMALL = dict(img_size=(32, 32), patch_size=8, embed_dims=32, num_layers=2,
             num_heads=2)


@pytest.mark.parametrize('pool,s,hw,fitted', [
    ((4, 4), 1, (3, 12), ((3, 4), 1)),
    ((7, 7), 3, (2, 128), ((2, 7), 3)),
    ((7, 7), 3, (1, 1), ((1, 1), 1)),
    ((2, 3), 5, (5, 5), ((2, 3), 5)),
    ((2, 2), 3, (1, 2), ((1, 2), 2)),  # s reduced to the fitted m
])
def test_options_fitted_to_a_small_grid(pool, s, hw, fitted):
    got = MiTAOptions(pool_size=pool, topk=4, experts_per_query=s).fitted(hw)
    assert (got.pool_size, got.experts_per_query) == fitted


def test_small_image_with_more_experts_per_query_than_landmarks():
    # An 8 x 16 image: a 1 x 2 patch grid, so pool_size=2 fits to m = 2
    # landmarks and experts_per_query=3 to 2 (each query then sees both
    # experts): a segmentation, not an error.
    torch.manual_seed(0)
    model = MiTAViT(**SMALL, mita_cfg=dict(pool_size=2, topk=2,
                                           experts_per_query=3)).eval()
    x = torch.randn(1, 3, 8, 16)
    (out, ) = model(x)
    assert out.shape == (1, 32, 1, 2)
    model.set_mita(dict(pool_size=(1, 2), topk=2, experts_per_query=2))
    torch.testing.assert_close(model(x)[0], out)


@pytest.mark.parametrize('size,grid,pool', [
    ((24, 96), (3, 12), (3, 4)),  # the 37 x 203 image resized to 96
    ((16, 4000), (2, 500), (2, 4)),
    ((8, 8), (1, 1), (1, 1)),
    ((17, 17), (3, 3), (3, 3)),
])
def test_small_grids_use_one_landmark_per_patch(monkeypatch, size, grid,
                                                pool):
    calls = []

    def recording(q, k, v, hw, **kwargs):
        calls.append((hw, kwargs['options'].pool_size))
        return mita_attention(q, k, v, hw, **kwargs)

    monkeypatch.setattr(mita_vit, 'mita_attention', recording)
    model = MiTAViT(**SMALL, mita_cfg=dict(pool_size=4, topk=5)).eval()
    (out, ) = model(torch.randn(1, 3, *size))
    assert out.shape == (1, 32, *grid)
    assert calls == [(grid, pool)] * 2


def test_small_grid_layer_is_mita_with_the_fitted_grid():
    model = MiTAViT(**SMALL, mita_cfg=dict(pool_size=4, topk=5))
    attn = model.layers[0].attn.eval()
    x = torch.randn(2, 1 + 18, 32)
    got = attn(x, hw_shape=(2, 9))
    mha = attn.attn
    qkv = torch.nn.functional.linear(x, mha.in_proj_weight, mha.in_proj_bias)
    q, k, v = qkv.view(2, 19, 3, 2, 16).permute(2, 0, 3, 1, 4)
    ref = mita_attention(q, k, v, (2, 9), pool_size=(2, 4), topk=5,
                         backend='torch')
    ref = mha.out_proj(ref.transpose(1, 2).reshape(2, 19, 32))
    torch.testing.assert_close(got, x + ref)


def test_the_operator_keeps_its_strict_check():
    q = torch.randn(1, 1, 1 + 6, 4)
    with pytest.raises(ValueError, match='pool_size'):
        mita_attention(q, q, q, (2, 3), pool_size=3, topk=2)


def test_input_smaller_than_one_patch_is_an_error():
    model = MiTAViT(**SMALL)
    with pytest.raises(ValueError, match='smaller than one patch'):
        model(torch.randn(1, 3, 7, 100))


IMAGES = [(37, 203), (16, 4000), (17, 17)]
# Cityscapes configs shrunk for speed (random init either way).
SHRINK = {
    'cbt': {
        'model.backbone.num_layers': 2,
        'model.backbone.embed_dims': 64,
        'model.backbone.num_heads': 2,
        'model.decode_head.in_channels': 64,
        'model.decode_head.head_dims': 16,
    },
    'upernet': {
        'model.backbone.num_layers': 4,
        'model.backbone.out_indices': (0, 1, 2, 3),
        'model.backbone.embed_dims': 64,
        'model.backbone.num_heads': 2,
        'model.neck.in_channels': [64] * 4,
        'model.neck.out_channels': 32,
        'model.decode_head.in_channels': [32] * 4,
        'model.decode_head.channels': 16,
        'model.auxiliary_head.in_channels': 32,
        'model.auxiliary_head.channels': 16,
    },
}
CONFIGS = [
    ('mita-vit-mini8_upernet_1xb8-1k_demo-96x96.py', {}),
    ('mita-vit-s16_cbt_8xb1-80k_cityscapes-1024x1024.py', SHRINK['cbt']),
    ('mita-vit-s16_upernet_8xb1-80k_cityscapes-1024x1024.py',
     SHRINK['upernet']),
]


@pytest.fixture(scope='module', params=CONFIGS, ids=[c for c, _ in CONFIGS])
def segmentor(request):
    name, options = request.param
    torch.manual_seed(0)
    return init_model(osp.join(ROOT, 'configs/mita_vit', name),
                      device='cpu', cfg_options=dict(options))


@pytest.mark.parametrize('size', IMAGES, ids=[f'{h}x{w}' for h, w in IMAGES])
def test_inference_model_segments_any_image(segmentor, size):
    image = np.random.default_rng(0).integers(0, 256, (*size, 3),
                                              dtype=np.uint8)
    result = inference_model(segmentor, image)
    assert result.pred_sem_seg.shape == size
    logits = result.seg_logits.data
    assert logits.shape[1:] == size and torch.isfinite(logits).all()


def test_grid_smaller_than_the_landmark_grid():
    """The demo model behind a keep-ratio resize into
    96 x 96 (the demo's former test pipeline). A 37 x 203 image becomes
    18 x 96 pixels, a 3 x 12 patch grid under the 4 x 4 landmark grid; the
    data preprocessor pads it to 32 x 96 (4 x 12 patches), which the neck's
    0.25 scale needs."""
    pipeline = [
        dict(type='LoadImageFromNDArray'),
        dict(type='Resize', scale=(96, 96), keep_ratio=True),
        dict(type='PackSegInputs')
    ]
    model = init_model(
        osp.join(ROOT, 'configs/mita_vit',
                 'mita-vit-mini8_upernet_1xb8-1k_demo-96x96.py'),
        device='cpu', cfg_options=dict(test_pipeline=pipeline))
    image = np.random.default_rng(0).integers(0, 256, (37, 203, 3),
                                              dtype=np.uint8)
    grids = []
    model.backbone.layers[0].attn.register_forward_pre_hook(
        lambda attn, args, kwargs: grids.append(kwargs['hw_shape']),
        with_kwargs=True)
    result = inference_model(model, image)
    assert result.pred_sem_seg.shape == (37, 203)
    assert grids == [(4, 12)]
