"""Helpers shared by the tests that run mmseg's tools in a subprocess or
build models from the configs."""
import os
import os.path as osp
import re
import struct
import subprocess
import sys
import zipfile

from mmseg_mita.datasets.demo_data import CLASSES, majority_class_miou

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO_CONFIG = 'configs/mita_vit/mita-vit-mini8_upernet_1xb8-1k_demo-96x96.py'


def data_opts(data_root, iters=4):
    """``--cfg-options`` shrinking the demo config to ``iters`` iterations
    (checkpoints every ``iters // 2``) of batch 2 on ``data_root``, without
    dataloader workers."""
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


def last_miou(out):
    """The last ``mIoU: X`` that mmseg printed in ``out``."""
    found = re.findall(r'mIoU: ([0-9.]+)', out)
    assert found, 'mmseg printed no mIoU:\n' + out[-3000:]
    return float(found[-1])


def assert_beats_majority_class(miou, data_root):
    """``miou`` is above the mIoU of predicting the most frequent class
    everywhere on the validation set of ``data_root`` (the best a model
    that ignores its input can reach).

    The demo model after 4 iterations: 16.52 (16.26 with --tta) against
    10.46 on the 4 validation images of the ``demo_data`` fixture."""
    baseline = majority_class_miou(
        osp.join(data_root, 'annotations', 'validation'), len(CLASSES))
    assert miou > baseline, (
        f'mIoU {miou:.2f} is not above the majority-class baseline '
        f'{baseline:.2f}: the predictions do not depend on the image')


def run(repo_root, cmd, returncode=0, env=None):
    """Run ``cmd`` in the repository with ``env`` added to the environment;
    asserts its exit status (a negative one: killed by that signal) and
    returns its combined output."""
    proc = subprocess.run(cmd, cwd=repo_root, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == returncode, proc.stdout[-4000:]
    return proc.stdout


def run_python(repo_root, args, **kwargs):
    """``run`` with this interpreter: ``python ARGS``."""
    return run(repo_root, [sys.executable] + args, **kwargs)


def probe_config(tmp_path, **probe_args):
    """A config file: the demo config with ``train_probe.TrainProbeHook``
    (run it with ``PROBE_ENV`` in the environment)."""
    path = tmp_path / 'probe_config.py'
    path.write_text(
        f'_base_ = {osp.join(ROOT, DEMO_CONFIG)!r}\n'
        'custom_imports = dict(imports=[\'mmseg_mita.mmseg_plugin\', '
        "'train_probe'], allow_failed_imports=False)\n"
        f'custom_hooks = [dict(type=\'TrainProbeHook\', **{probe_args!r})]\n')
    return str(path)


# lets training subprocesses import train_probe
PROBE_ENV = {
    'PYTHONPATH':
    os.pathsep.join(
        filter(None, [osp.dirname(osp.abspath(__file__)),
                      os.environ.get('PYTHONPATH')]))
}


def flip_bit_in_tensor(path):
    """The bytes of torch's zip checkpoint ``path`` with one bit flipped in
    the middle of its largest stored tensor (``torch.load`` alone reads
    such a file without complaint)."""
    with open(path, 'rb') as f:
        data = bytearray(f.read())
    with zipfile.ZipFile(path) as archive:
        member = max((i for i in archive.infolist() if '/data/' in
                      i.filename), key=lambda i: i.file_size)
    assert member.compress_type == zipfile.ZIP_STORED
    # local header: 30 bytes, then the name and the extra field
    name_len, extra_len = struct.unpack_from('<HH', data,
                                             member.header_offset + 26)
    start = member.header_offset + 30 + name_len + extra_len
    data[start + member.file_size // 2] ^= 0x10
    return bytes(data)


def build_segmentor(model_cfg):
    """The segmentor of ``model_cfg`` with pretrained weights off, BN for
    SyncBN, in eval mode (seeded)."""
    import torch
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    model_cfg.backbone.init_cfg = None
    torch.manual_seed(0)
    return revert_sync_batchnorm(MODELS.build(model_cfg)).eval()


def infer(model, size):
    """Logits of one inference (whole or slide, as the model's test_cfg
    says) on a random image of ``size`` (H, W)."""
    import torch
    meta = dict(img_shape=size, ori_shape=size, pad_shape=size,
                padding_size=[0, 0, 0, 0])
    with torch.no_grad():
        return model.inference(torch.randn(1, 3, *size), [meta])


def scheduled_end(cfg, scheduler):
    """The iteration where an iteration-based ``scheduler`` of ``cfg`` ends:
    its ``end``, or, without one, the train loop's ``max_iters`` (what
    mmengine's Runner sets by default)."""
    return scheduler.get('end', cfg.train_cfg.max_iters)
