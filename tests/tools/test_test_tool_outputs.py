"""mmseg's tools/test.py with the plugin: --show-dir overlays and --tta."""
import glob
import os
import os.path as osp

import cv2
import pytest
import torch
from mmengine import Config
from mmengine.registry import init_default_scope
from mmseg.registry import MODELS

from helpers import (DEMO_CONFIG, ROOT, assert_beats_majority_class,
                     data_opts, last_miou, run_python)


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    """An (untrained) demo model saved as a checkpoint."""
    init_default_scope('mmseg')
    torch.manual_seed(0)
    model = MODELS.build(Config.fromfile(osp.join(ROOT, DEMO_CONFIG)).model)
    model.init_weights()
    path = str(tmp_path_factory.mktemp('ckpt') / 'demo.pth')
    torch.save({'state_dict': model.state_dict()}, path)
    return path


def test_show_dir_writes_overlays(repo_root, demo_data, checkpoint,
                                  tmp_path):
    # mmseg resolves --show-dir from the current directory and draws every
    # `interval`-th image (default 50)
    show_dir = str(tmp_path / 'vis')
    run_python(repo_root, [
        'tools/test.py', DEMO_CONFIG, checkpoint, '--work-dir',
        str(tmp_path), '--show-dir', show_dir, '--cfg-options',
        'default_hooks.visualization.interval=1'
    ] + data_opts(demo_data))
    pictures = sorted(
        glob.glob(osp.join(show_dir, '**', '*.png'), recursive=True))
    # one per validation image: ground truth | prediction, side by side
    images = os.listdir(osp.join(demo_data, 'images', 'validation'))
    assert sorted(osp.basename(p) for p in pictures) == sorted(
        f'test_{name}_0.png' for name in images)
    assert cv2.imread(pictures[0]).shape == (96, 2 * 96, 3)


def test_tta(repo_root, demo_data, trained, tmp_path):
    out = run_python(repo_root, [
        'tools/test.py', DEMO_CONFIG, osp.join(trained, 'iter_4.pth'),
        '--work-dir', str(tmp_path), '--tta', '--cfg-options'
    ] + data_opts(demo_data))
    assert_beats_majority_class(last_miou(out), demo_data)
    dumped = open(osp.join(tmp_path, osp.basename(DEMO_CONFIG))).read()
    assert "type='SegTTAModel'" in dumped
    assert "type='TestTimeAug'" in dumped
