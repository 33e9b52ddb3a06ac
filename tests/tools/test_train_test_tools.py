"""End to end through mmseg's own train and test tools (tools/*.py)."""
import glob
import json
import math
import os.path as osp

from helpers import DEMO_CONFIG as CONFIG
from helpers import assert_beats_majority_class, last_miou
from helpers import data_opts as _data_opts
from helpers import run_python as _run


def test_train_writes_checkpoints_and_validates(trained, demo_data):
    assert osp.isfile(osp.join(trained, 'iter_4.pth'))
    scalars = sorted(
        glob.glob(osp.join(trained, '*', 'vis_data', 'scalars.json')))
    records = [json.loads(line) for line in open(scalars[-1])]
    assert_beats_majority_class(
        [r['mIoU'] for r in records if 'mIoU' in r][-1], demo_data)
    losses = [r['loss'] for r in records if 'loss' in r]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)


def test_test_tool_loads_mmengine_checkpoint(repo_root, trained, demo_data):
    # mmengine's own checkpoint (with its message hub) must load under
    # torch >= 2.6's weights_only default.
    out = _run(repo_root, [
        'tools/test.py', CONFIG, osp.join(trained, 'iter_4.pth'),
        '--work-dir', osp.join(trained, 'test'), '--cfg-options'
    ] + _data_opts(demo_data))
    assert_beats_majority_class(last_miou(out), demo_data)


def test_resume_continues_from_last_checkpoint(repo_root, trained,
                                               demo_data):
    out = _run(repo_root, [
        'tools/train.py', CONFIG, '--work-dir', trained, '--resume',
        '--cfg-options'
    ] + _data_opts(demo_data, iters=6))
    assert 'resumed epoch: 0, iter: 4' in out
    assert osp.isfile(osp.join(trained, 'iter_6.pth'))
