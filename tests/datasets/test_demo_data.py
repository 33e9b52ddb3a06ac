"""The procedural demo dataset and its majority-class baseline."""
import filecmp
import os
import os.path as osp

import cv2
import numpy as np
import pytest

from mmseg_mita.datasets.demo_data import (CLASSES, majority_class_miou,
                                           make_dataset)


def test_layout_and_labels(tmp_path):
    out = str(tmp_path / 'demo')
    make_dataset(out, num_train=3, num_val=2, size=48, seed=1)
    for split, count in (('training', 3), ('validation', 2)):
        images = sorted(os.listdir(osp.join(out, 'images', split)))
        annotations = sorted(os.listdir(osp.join(out, 'annotations', split)))
        assert len(images) == count and all(f.endswith('.jpg')
                                            for f in images)
        assert [f[:-4] for f in images] == [f[:-4] for f in annotations]
        for name in annotations:
            ann = cv2.imread(osp.join(out, 'annotations', split, name),
                             cv2.IMREAD_UNCHANGED)
            assert ann.shape == (48, 48) and ann.dtype == np.uint8
            # 0 = ignore (outlines), 1..C = classes, as ADE20K
            assert set(np.unique(ann)) <= set(range(len(CLASSES) + 1))
            assert 0 in ann and 1 in ann  # outlines and sky always exist


def test_deterministic_from_seed(tmp_path):
    a, b, c = (str(tmp_path / n) for n in 'abc')
    make_dataset(a, 2, 1, 32, seed=3)
    make_dataset(b, 2, 1, 32, seed=3)
    make_dataset(c, 2, 1, 32, seed=4)
    name = 'annotations/training/demo_training_00000.png'
    assert filecmp.cmp(osp.join(a, name), osp.join(b, name), shallow=False)
    assert not filecmp.cmp(osp.join(a, name), osp.join(c, name),
                           shallow=False)


def test_refuses_to_overwrite(tmp_path):
    with pytest.raises(FileExistsError, match='exists'):
        make_dataset(str(tmp_path), 1, 1, 32)


def test_majority_baseline(tmp_path):
    ann_dir = tmp_path / 'ann'
    ann_dir.mkdir()
    ann = np.zeros((4, 4), np.uint8)  # 0 = ignored
    ann[:2] = 1  # class 0: 8 pixels
    ann[2, :2] = 2  # class 1: 2 pixels; classes 2.. absent
    cv2.imwrite(str(ann_dir / 'a.png'), ann)
    # majority class 0: IoU 8 / 10; class 1: IoU 0 -> mean over 2 present
    assert majority_class_miou(str(ann_dir), 5) == pytest.approx(40.0)
