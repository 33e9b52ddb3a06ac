"""Quick-start demo: train and evaluate MiTA-ViT + UPerNet on CPU.

1. writes the procedural demo dataset (tools/make_demo_data.py) if absent;
2. trains with mmsegmentation's tools/train.py (through tools/train.py);
3. evaluates the final checkpoint with mmseg's tools/test.py (IoUMetric);
4. prints the final mIoU beside that of always predicting the most frequent
   class, the floor that a model which learned nothing would reach.
"""
import argparse
import os.path as osp
import re
import subprocess
import sys

from mmseg_mita.datasets.demo_data import (CLASSES, majority_class_miou,
                                           make_dataset)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

DEFAULT_CONFIG = 'configs/mita_vit/mita-vit-mini8_upernet_1xb8-1k_demo-96x96.py'


def run(cmd):
    """Run ``cmd`` from the repo root, streaming its output; return it."""
    print('+ ' + ' '.join(cmd), flush=True)
    lines = []
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
    if proc.returncode != 0:
        sys.exit(f'demo: `{" ".join(cmd)}` failed (exit {proc.returncode})')
    return ''.join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--config', default=DEFAULT_CONFIG)
    parser.add_argument('--data-root', default='data/demo_ade')
    parser.add_argument('--work-dir', default=None)
    args = parser.parse_args()
    work_dir = args.work_dir or osp.join(
        'work_dirs', osp.splitext(osp.basename(args.config))[0])
    data_root = osp.join(ROOT, args.data_root)
    if not osp.isdir(data_root):
        print(f'demo: writing the demo dataset to {args.data_root}')
        make_dataset(data_root)

    py = sys.executable
    data_opt = f'data_root={args.data_root}'
    opts = ['--cfg-options', f'train_dataloader.dataset.{data_opt}',
            f'val_dataloader.dataset.{data_opt}',
            f'test_dataloader.dataset.{data_opt}']
    run([py, 'tools/train.py', args.config, '--work-dir', work_dir] + opts)
    with open(osp.join(ROOT, work_dir, 'last_checkpoint')) as f:
        checkpoint = f.read().strip()
    out = run([py, 'tools/test.py', args.config, checkpoint, '--work-dir',
               osp.join(work_dir, 'test')] + opts)
    found = re.findall(r'mIoU: ([0-9.]+)', out)
    if not found:
        sys.exit('demo: mmseg did not report an mIoU')
    baseline = majority_class_miou(
        osp.join(data_root, 'annotations', 'validation'), len(CLASSES))
    print()
    print(f'config:      {args.config}')
    print(f'checkpoint:  {checkpoint}')
    print(f'final mIoU (mmseg IoUMetric, tools/test.py): {float(found[-1]):.2f}')
    print(f'majority-class baseline mIoU:                {baseline:.2f}')


if __name__ == '__main__':
    main()
