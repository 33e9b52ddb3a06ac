"""Inference time per image: ONNX Runtime against PyTorch eager, MiTA and
full attention, in one run.

    python tools/benchmark_onnx.py [--configs MITA FULL ...]
        [--size 512 512] [--repeats 5] [--threads 2] [--time-budget 60]
        [--json out.json]

Each config (default: ViT-S/16 + CBT, MiTA and its full-attention twin) is
built with random weights, exported with ``tools/export_onnx.py``'s steps
(fixed input size) to a temporary file and loaded in ONNX Runtime (CPU).
Every (config, runtime) pair gets the same random image; after one warm-up
call each, runs are interleaved (all pairs see the same machine load) and
the best of ``--repeats`` is reported. PyTorch runs under
``torch.inference_mode`` with ``--threads`` threads, ONNX Runtime with as
many intra-op threads. The table gives milliseconds per image and the
ratios ONNX Runtime / PyTorch (same model) and MiTA / full attention (same
runtime; the full-attention config is the last one).
"""
import argparse
import copy
import os.path as osp
import tempfile

import numpy as np
import torch

from mmseg_mita.benchmarks import machine_info, summarize, time_interleaved
from mmseg_mita.utils import write_json

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = [
    'configs/mita_vit/mita-vit-s16_cbt_8xb1-160k_ade20k-512x512.py',
    'configs/mita_vit/vit-s16_cbt_8xb1-160k_ade20k-512x512.py',
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='ONNX Runtime vs PyTorch eager: inference time per '
        'image')
    parser.add_argument('--configs', nargs='+', default=CONFIGS,
                        help='configs to compare; the last is the baseline '
                        'of the MiTA / full ratio')
    parser.add_argument('--size', type=int, nargs=2, default=[512, 512],
                        metavar=('H', 'W'))
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--threads', type=int, default=2,
                        help='threads of both runtimes')
    parser.add_argument('--time-budget', type=float, default=60.0,
                        help='stop repeating a pair once its runs add up '
                        'to this many seconds')
    parser.add_argument('--json', metavar='PATH',
                        help="write the results as JSON ('-': stdout)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.threads < 1 or min(args.size) < 1:
        parser.error('--repeats, --threads and --size must be >= 1')
    return args


def _runners(config: str, size, threads: int, folder: str):
    """(PyTorch call, ONNX Runtime call, max |logit difference|) of one
    config on one random image."""
    import onnxruntime as ort

    from mmseg_mita.deploy import (SegmentorLogits, build_segmentor,
                                   export_onnx, prepare_for_export)
    torch.manual_seed(0)
    model = build_segmentor(osp.join(ROOT, config))
    exported = copy.deepcopy(model)
    prepare_for_export(exported)
    path = osp.join(folder, osp.basename(config) + '.onnx')
    export_onnx(exported, tuple(size), path)
    del exported

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(path, options,
                                   providers=['CPUExecutionProvider'])
    wrapper = SegmentorLogits(model).eval()
    gen = torch.Generator().manual_seed(0)
    image = torch.randn(1, 3, *size, generator=gen)
    feed = {'inputs': image.numpy()}

    def run_torch():
        with torch.inference_mode():
            return wrapper(image)

    def run_ort():
        return session.run(None, feed)[0]

    diff = float(np.abs(run_torch().numpy() - run_ort()).max())  # warm-up
    return run_torch, run_ort, diff


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    fns, diffs = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for config in args.configs:
            name = osp.splitext(osp.basename(config))[0]
            run_torch, run_ort, diffs[name] = _runners(
                config, args.size, args.threads, folder)
            fns[(name, 'pytorch')] = run_torch
            fns[(name, 'onnxruntime')] = run_ort
        keyed = {f'{n}|{r}': fn for (n, r), fn in fns.items()}
        times = time_interleaved(keyed, torch.device('cpu'), args.repeats,
                                 args.time_budget)
    stats = {key: summarize(t) for key, t in times.items()}
    names = [osp.splitext(osp.basename(c))[0] for c in args.configs]
    base = names[-1]

    def best(name, runtime):
        return stats[f'{name}|{runtime}']['best_s']

    h, w = args.size
    print(f'inference of one {h} x {w} image, best of {args.repeats}, '
          f'{args.threads} threads each (ms)')
    print('| config | PyTorch eager | ONNX Runtime | ORT / PyTorch | '
          f'vs {base}: PyTorch | vs {base}: ORT | max abs logit diff |')
    print('|---|---:|---:|---:|---:|---:|---:|')
    for name in names:
        pt, ox = best(name, 'pytorch'), best(name, 'onnxruntime')
        print(f'| {name} | {pt * 1e3:.0f} | {ox * 1e3:.0f} | {ox / pt:.2f} '
              f'| {pt / best(base, "pytorch"):.2f} '
              f'| {ox / best(base, "onnxruntime"):.2f} '
              f'| {diffs[name]:.2g} |')
    if args.json:
        write_json(
            dict(size=args.size, threads=args.threads, repeats=args.repeats,
                 times=stats, max_abs_logit_diff=diffs,
                 machine=machine_info(torch.device('cpu'))), args.json)


if __name__ == '__main__':
    main()
