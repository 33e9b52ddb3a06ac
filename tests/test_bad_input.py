"""Bad data, checkpoints and inputs fail early with a message naming the
cause and the fix. (mita_cfg checks: tests/models/test_mita_vit.py.)"""
import os
import os.path as osp
import re
import shutil

import cv2
import numpy as np
import pytest
import torch
from mmengine import Config
from mmengine.registry import init_default_scope
from mmengine.runner.checkpoint import CheckpointLoader
from mmseg.registry import DATASETS

import mmseg_mita.mmseg_plugin  # noqa: F401  (the checks and loader tested)
from helpers import DEMO_CONFIG, ROOT, flip_bit_in_tensor
from mmseg_mita.models import MiTAViT

SMALL = dict(img_size=(32, 32), patch_size=8, embed_dims=32, num_layers=3,
             num_heads=2, mita_cfg=dict(pool_size=2, topk=4))


def _demo_train_set(data_root):
    """The demo config's training set (its pipeline checks annotations)."""
    init_default_scope('mmseg')
    cfg = Config.fromfile(osp.join(ROOT, DEMO_CONFIG))
    dataset = cfg.train_dataloader.dataset
    dataset.data_root = str(data_root)
    return DATASETS.build(dataset)


# --- data ------------------------------------------------------------------


def test_missing_data_root(tmp_path):
    with pytest.raises(FileNotFoundError,
                       match='dataset folder does not exist') as info:
        _demo_train_set(tmp_path / 'nowhere')
    assert f"data_root='{tmp_path / 'nowhere'}'" in str(info.value)
    assert 'train_dataloader.dataset.data_root=PATH' in str(info.value)


def test_empty_data_root(tmp_path):
    os.makedirs(tmp_path / 'images' / 'training')
    with pytest.raises(ValueError,
                       match=r"found no images ending in '\.jpg'") as info:
        _demo_train_set(tmp_path)
    assert "data_prefix.img_path='" in str(info.value)


@pytest.fixture
def broken_data(demo_data, tmp_path):
    """A copy of the demo data: 2 training samples, to be damaged."""
    root = tmp_path / 'data'
    for kind, ext in (('images', '.jpg'), ('annotations', '.png')):
        os.makedirs(root / kind / 'training')
        for name in sorted(os.listdir(osp.join(demo_data, kind,
                                               'training')))[:2]:
            shutil.copy(osp.join(demo_data, kind, 'training', name),
                        root / kind / 'training' / name)
    first = sorted(os.listdir(root / 'annotations' / 'training'))[0]
    return root, str(root / 'annotations' / 'training' / first)


def test_annotation_of_another_size(broken_data):
    root, ann = broken_data
    cv2.imwrite(ann, cv2.imread(ann, cv2.IMREAD_UNCHANGED)[:48, :64])
    dataset = _demo_train_set(root)
    with pytest.raises(ValueError) as info:
        dataset[0]
    msg = str(info.value)
    assert f'annotation {ann}' in msg
    assert 'has shape (48, 64) but the image is 96x96' in msg


def test_colour_annotation(broken_data):
    root, ann = broken_data
    label = cv2.imread(ann, cv2.IMREAD_UNCHANGED)
    cv2.imwrite(ann, np.stack([label] * 3, axis=-1))
    with pytest.raises(ValueError, match=r'shape \(96, 96, 3\).*'
                       'single-channel'):
        _demo_train_set(root)[0]


def test_label_outside_the_classes(broken_data):
    root, ann = broken_data
    label = cv2.imread(ann, cv2.IMREAD_UNCHANGED)
    label[:4, :4] = 9  # 5 classes: 1..5 in the file, 0 = ignore
    cv2.imwrite(ann, label)
    with pytest.raises(ValueError) as info:
        _demo_train_set(root)[0]
    assert re.search(
        r'label values \[8\] \(stored in the file as \[9\]: '
        r'reduce_zero_label=True subtracts 1\) are outside 0\.\.4 '
        r'\(num_classes=5\) and not the ignore index 255', str(info.value))


def test_good_annotations_pass(broken_data):
    root, _ = broken_data
    for sample in _demo_train_set(root):  # random resize and crop
        assert sample['inputs'].shape[1:] == \
            sample['data_samples'].gt_sem_seg.shape


# --- checkpoints -----------------------------------------------------------


def _pretrained(path, **kwargs):
    return MiTAViT(**{**SMALL, **kwargs},
                   init_cfg=dict(type='Pretrained', checkpoint=str(path)))


@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(0)
    model = MiTAViT(**SMALL)
    path = tmp_path / 'vit.pth'
    torch.save({'state_dict': model.state_dict()}, path)
    return path, model.state_dict()


def test_fitting_checkpoint_loads(checkpoint):
    path, weights = checkpoint
    model = _pretrained(path)
    model.init_weights()
    for key, value in model.state_dict().items():
        assert torch.equal(value, weights[key]), key


def test_checkpoint_for_another_resolution_loads(checkpoint):
    # mmseg resizes pos_embed before loading: a fit, not a mismatch
    path, _ = checkpoint
    model = _pretrained(path, img_size=(48, 48))
    model.init_weights()
    assert model.pos_embed.shape == (1, 1 + 6 * 6, 32)


@pytest.mark.parametrize(
    'damage', ['truncated', 'empty', 'garbage', 'bit-flipped', 'bytes-lost'])
def test_corrupt_checkpoint(checkpoint, tmp_path, damage):
    path, _ = checkpoint
    data = path.read_bytes()
    # bytes-lost: 7 bytes of the first member's header gone, so every offset
    # of the zip directory points past its entry (zipfile then seeks to a
    # negative position: a raw OSError unless reported)
    broken = {'truncated': lambda: data[:len(data) // 2],
              'empty': lambda: b'',
              'garbage': lambda: b'<html>404 Not Found</html>',
              'bit-flipped': lambda: flip_bit_in_tensor(path),
              'bytes-lost': lambda: data[:37] + data[44:]}[damage]()
    bad = tmp_path / 'bad.pth'
    bad.write_bytes(broken)
    pattern = (rf'checkpoint {re.escape(str(bad))} \({len(broken)} bytes\) '
               'is corrupt or truncated')
    with pytest.raises(ValueError, match=pattern):
        CheckpointLoader.load_checkpoint(str(bad))  # load_from, --resume
    with pytest.raises(ValueError, match=pattern):
        _pretrained(bad).init_weights()  # init_cfg=Pretrained


def test_checkpoint_for_another_width(checkpoint):
    path, _ = checkpoint
    with pytest.raises(ValueError) as info:
        _pretrained(path, embed_dims=64).init_weights()
    assert (f'checkpoint {path} does not fit the backbone: cls_token has '
            'shape (1, 1, 32) in the checkpoint but (1, 1, 64) in the '
            'model') in str(info.value)


def test_checkpoint_for_another_depth(checkpoint):
    path, _ = checkpoint
    for depth in (2, 4):
        with pytest.raises(ValueError,
                           match=f'has 3 transformer layers but the backbone '
                           f'has num_layers={depth}'):
            _pretrained(path, num_layers=depth,
                        out_indices=depth - 1).init_weights()


def test_checkpoint_missing_keys(checkpoint, tmp_path):
    _, weights = checkpoint
    weights = {k: v for k, v in weights.items() if '1.ln1' not in k}
    path = tmp_path / 'partial.pth'
    torch.save(weights, path)
    with pytest.raises(ValueError, match=r'lacks 2 of the backbone\'s \d+ '
                       r'weights: layers\.1\.ln1\.weight, '
                       r'layers\.1\.ln1\.bias\.'):
        _pretrained(path).init_weights()


# --- inputs ----------------------------------------------------------------


def test_image_smaller_than_one_patch():
    model = MiTAViT(**SMALL)  # patch 8
    with pytest.raises(ValueError,
                       match=r'input image of size \(4, 12\) is smaller '
                       r'than one patch \(patch_size=8\)'):
        model(torch.randn(1, 3, 4, 12))
