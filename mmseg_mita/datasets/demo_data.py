"""A small procedural segmentation dataset in ADE20K's folder layout.

    python tools/make_demo_data.py data/demo_ade [--train 240 --val 48]

Layout (as ADEChallengeData2016): ``images/{training,validation}/*.jpg`` and
``annotations/{training,validation}/*.png``. Annotation 0 means "ignore"
(object outlines), 1..5 are the classes, so the dataset uses
``reduce_zero_label=True`` exactly like ADE20K.

Every class gets random colours per instance, so colour alone says nothing:
sky is a smooth gradient above the horizon, ground a grainy texture below
it, and three object classes differ only by their pattern (stripes,
checkerboard, dots). Telling them apart needs texture and context, so the
mIoU of a trained model measures learning. The output is a function of the
seed alone. :func:`majority_class_miou` is the floor a model that ignores
its input reaches.
"""
import argparse
import glob
import os
import os.path as osp
import shutil
import sys
import tempfile

import cv2
import numpy as np

CLASSES = ('sky', 'ground', 'stripes', 'checker', 'dots')
PALETTE = [[70, 130, 180], [140, 100, 60], [220, 20, 60], [250, 170, 30],
           [0, 180, 120]]


def _colour(rng):
    return rng.uniform(0, 255, size=3)


def _pattern(kind, rng, yy, xx):
    """Boolean foreground mask of an object pattern."""
    if kind == 'stripes':
        theta = rng.uniform(0, np.pi)
        period = rng.uniform(5, 9)
        phase = xx * np.cos(theta) + yy * np.sin(theta)
        return (phase % period) < period / 2
    if kind == 'checker':
        cell = rng.integers(4, 8)
        return ((yy // cell + xx // cell) % 2).astype(bool)
    spacing = rng.integers(6, 10)
    radius = rng.uniform(1.5, 2.6)
    dy = (yy % spacing) - spacing / 2
    dx = (xx % spacing) - spacing / 2
    return dy * dy + dx * dx < radius * radius


def _shape(rng, size, yy, xx):
    cy, cx = rng.uniform(0.15, 0.85, size=2) * size
    ry, rx = rng.uniform(0.12, 0.3, size=2) * size
    if rng.random() < 0.5:
        return (np.abs(yy - cy) < ry) & (np.abs(xx - cx) < rx)
    return ((yy - cy) / ry)**2 + ((xx - cx) / rx)**2 < 1


def make_sample(rng, size):
    """One (BGR image uint8 [H, W, 3], annotation uint8 [H, W]) pair."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    horizon = rng.uniform(0.3, 0.65) * size
    top, bottom = _colour(rng), _colour(rng)
    t = (yy / size)[..., None]
    image = top * (1 - t) + bottom * t
    label = np.ones((size, size), np.uint8)  # sky
    ground = yy >= horizon
    grain = rng.normal(0, 45, size=(size, size, 1))
    image[ground] = (_colour(rng) + grain)[ground]
    label[ground] = 2
    for _ in range(rng.integers(1, 4)):
        cls = rng.integers(3, 6)
        mask = _shape(rng, size, yy, xx)
        fg = _pattern(CLASSES[cls - 1], rng, yy, xx)
        tex = np.where(fg[..., None], _colour(rng), _colour(rng))
        image[mask] = tex[mask]
        label[mask] = cls
    # Object outlines are unlabelled (0 = ignore), as in ADE20K.
    kernel = np.ones((3, 3), np.uint8)
    edges = cv2.dilate(label, kernel) != cv2.erode(label, kernel)
    label[edges] = 0
    image += rng.normal(0, 6, size=image.shape)
    return np.clip(image, 0, 255).astype(np.uint8), label


def write_split(root, split, count, rng, size):
    img_dir = osp.join(root, 'images', split)
    ann_dir = osp.join(root, 'annotations', split)
    os.makedirs(img_dir)
    os.makedirs(ann_dir)
    for i in range(count):
        image, label = make_sample(rng, size)
        name = f'demo_{split}_{i:05d}'
        cv2.imwrite(osp.join(img_dir, name + '.jpg'), image,
                    [cv2.IMWRITE_JPEG_QUALITY, 95])
        cv2.imwrite(osp.join(ann_dir, name + '.png'), label)


def make_dataset(out, num_train=240, num_val=48, size=96, seed=0):
    """Write the dataset to ``out`` (atomically: built aside, then renamed)."""
    if osp.exists(out):
        raise FileExistsError(f'{out} exists; remove it or choose another '
                              'output folder')
    parent = osp.dirname(osp.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix='.demo_data-', dir=parent)
    try:
        rng = np.random.default_rng(seed)
        write_split(tmp, 'training', num_train, rng, size)
        write_split(tmp, 'validation', num_val, rng, size)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def majority_class_miou(ann_dir: str, num_classes: int) -> float:
    """mIoU (%) of predicting the most frequent class on every pixel.

    With reduce_zero_label, annotation 0 is ignored and c in 1..C is class
    c - 1. The majority class's IoU is its share of valid pixels; every other
    class present has IoU 0 (mmseg's IoUMetric averages over present
    classes)."""
    counts = np.zeros(num_classes + 1, np.int64)
    for path in glob.glob(osp.join(ann_dir, '*.png')):
        ann = cv2.imread(path, cv2.IMREAD_UNCHANGED)
        counts += np.bincount(ann.ravel(), minlength=num_classes + 1)
    valid = counts[1:]
    present = int((valid > 0).sum())
    return 100.0 * valid.max() / valid.sum() / present


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('out', help='output folder (must not exist)')
    parser.add_argument('--train', type=int, default=240)
    parser.add_argument('--val', type=int, default=48)
    parser.add_argument('--size', type=int, default=96)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    try:
        make_dataset(args.out, args.train, args.val, args.size, args.seed)
    except FileExistsError as err:
        sys.exit(f'error: {err}')
    print(f'wrote {args.train} training and {args.val} validation samples '
          f'({args.size}x{args.size}) to {args.out}')
