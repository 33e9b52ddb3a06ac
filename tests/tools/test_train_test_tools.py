"""End to end through mmseg's own train and test tools (tools/*.py)."""
import glob
import json
import math
import os.path as osp
import re
import subprocess
import sys

import pytest

CONFIG = 'configs/mita_vit/mita-vit-mini8_upernet_1xb8-1k_demo-96x96.py'


def _data_opts(data_root, iters=4):
    opts = [
        f'train_cfg.max_iters={iters}', f'train_cfg.val_interval={iters}',
        f'default_hooks.checkpoint.interval={iters // 2}',
        'default_hooks.logger.interval=1',
        'param_scheduler.0.end=2', 'param_scheduler.1.begin=2',
        f'param_scheduler.1.end={iters}',
        'train_dataloader.batch_size=2', 'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False',
        'val_dataloader.num_workers=0',
        'val_dataloader.persistent_workers=False',
        'test_dataloader.num_workers=0',
        'test_dataloader.persistent_workers=False'
    ]
    for split in ('train', 'val', 'test'):
        opts.append(f'{split}_dataloader.dataset.data_root={data_root}')
    return opts


def _run(repo_root, args):
    proc = subprocess.run([sys.executable] + args, cwd=repo_root,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc.stdout


@pytest.fixture(scope='module')
def trained(repo_root, demo_data, tmp_path_factory):
    work_dir = str(tmp_path_factory.mktemp('work'))
    _run(repo_root, ['tools/train.py', CONFIG, '--work-dir', work_dir,
                     '--cfg-options'] + _data_opts(demo_data))
    return work_dir


def test_train_writes_checkpoints_and_validates(trained):
    assert osp.isfile(osp.join(trained, 'iter_4.pth'))
    scalars = sorted(
        glob.glob(osp.join(trained, '*', 'vis_data', 'scalars.json')))
    records = [json.loads(line) for line in open(scalars[-1])]
    assert any('mIoU' in r for r in records)
    losses = [r['loss'] for r in records if 'loss' in r]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)


def test_test_tool_loads_mmengine_checkpoint(repo_root, trained, demo_data):
    # mmengine's own checkpoint (with its message hub) must load under
    # torch >= 2.6's weights_only default.
    out = _run(repo_root, [
        'tools/test.py', CONFIG, osp.join(trained, 'iter_4.pth'),
        '--work-dir', osp.join(trained, 'test'), '--cfg-options'
    ] + _data_opts(demo_data))
    assert re.search(r'mIoU: [0-9.]+', out)


def test_resume_continues_from_last_checkpoint(repo_root, trained,
                                               demo_data):
    out = _run(repo_root, [
        'tools/train.py', CONFIG, '--work-dir', trained, '--resume',
        '--cfg-options'
    ] + _data_opts(demo_data, iters=6))
    assert 'resumed epoch: 0, iter: 4' in out
    assert osp.isfile(osp.join(trained, 'iter_6.pth'))
