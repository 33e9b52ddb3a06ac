"""The workloads and the sweep axes' value types (mmseg_mita.bench
.workloads)."""
import argparse

import pytest

from mmseg_mita.bench.cli import UsageError
from mmseg_mita.bench.workloads import (SEGMENTOR_CONFIGS,
                                        SEGMENTOR_WORKLOADS, batch_heads,
                                        encoder_setting, image_size,
                                        image_tokens, op_shape, patch_grid)


def test_patch_grid_is_the_most_square_h_by_w():
    assert [patch_grid(n) for n in (1025, 4097, 8193, 65537, 30)] == [
        (32, 32), (64, 64), (64, 128), (256, 256), (1, 29)]
    assert patch_grid(26, extra_tokens=2) == (4, 6)
    with pytest.raises(UsageError, match='fewer than the 1 extra'):
        patch_grid(1)


def test_image_tokens_round_patches_up():
    assert image_tokens((512, 512)) == 1025
    assert image_tokens((1024, 2048)) == 8193
    assert image_tokens((48, 80), patch=16) == 16
    assert image_tokens((50, 80), patch=16, extra_tokens=0) == 20


def test_batch_heads():
    assert [batch_heads(bh, 6) for bh in (12, 96, 6, 1)] == [
        (2, 6), (16, 6), (1, 6), (1, 1)]


def test_value_types():
    assert image_size('1024x2048') == (1024, 2048)
    assert op_shape('1025:12') == (1025, 12)
    assert encoder_setting('infer:32x64:1') == dict(
        kind='infer', size=[32, 64], batch=1, name='infer:32x64:1')
    for parse, text in ((image_size, '1024'), (op_shape, '1025'),
                        (encoder_setting, 'fit:16x16:2'),
                        (image_size, '0x4')):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def test_segmentor_workloads_and_configs(tmp_path, monkeypatch):
    from mmseg_mita import list_configs
    from mmseg_mita.bench.segmentors import load_config
    assert set(SEGMENTOR_CONFIGS.values()) <= set(list_configs())
    monkeypatch.chdir(tmp_path)  # packaged configs, from anywhere
    name = SEGMENTOR_CONFIGS[('cbt', 'ade20k')]
    assert load_config(name).model.backbone.type == 'MiTAViT'
    with pytest.raises(ValueError, match='no packaged config; near matches'):
        load_config(name[:-1])
    with pytest.raises(FileNotFoundError, match='no config at x/y.py'):
        load_config('x/y.py')
    slide = SEGMENTOR_WORKLOADS['cityscapes-slide']
    assert (slide.size, slide.crop, slide.stride) == ((1024, 2048),
                                                      (1024, 1024),
                                                      (768, 768))
    small = slide.scaled_down(16)
    assert (small.size, small.crop, small.stride) == ((64, 128), (64, 64),
                                                      (48, 48))
    assert SEGMENTOR_WORKLOADS['ade20k-512'].scaled_down(16).crop is None
