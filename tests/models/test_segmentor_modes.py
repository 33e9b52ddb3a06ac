"""MiTA-ViT segmentors at any input size, in whole and slide inference."""
import pytest
import torch
from mmengine.config import Config, ConfigDict
from mmseg.registry import MODELS
from mmseg.structures import SegDataSample
from mmseg.utils import register_all_modules

import mmseg_mita.mmseg_plugin  # noqa: F401  (MiTA in mmseg)

CONFIG = 'configs/mita_vit/mita-vit-mini8_upernet_1xb8-1k_demo-96x96.py'


@pytest.fixture(scope='module')
def segmentor(repo_root):
    register_all_modules()
    cfg = Config.fromfile(f'{repo_root}/{CONFIG}')
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.eval()
    return model


@pytest.mark.parametrize('mode,size', [
    ('whole', (96, 96)),
    ('whole', (72, 136)),   # other aspect ratio, grid 9 x 17
    ('whole', (100, 61)),   # not a multiple of the patch size
    ('slide', (96, 150)),
])
def test_predict_any_size(segmentor, mode, size):
    segmentor.test_cfg = ConfigDict(mode=mode)
    if mode == 'slide':
        segmentor.test_cfg.update(crop_size=(64, 64), stride=(48, 48))
    sample = SegDataSample(metainfo=dict(
        img_shape=size, ori_shape=size, pad_shape=size))
    with torch.no_grad():
        out = segmentor.predict(torch.randn(1, 3, *size), [sample])
    assert out[0].pred_sem_seg.data.shape == (1, *size)
    assert out[0].seg_logits.data.shape == (5, *size)
