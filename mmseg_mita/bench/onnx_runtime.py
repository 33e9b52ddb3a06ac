"""Inference time per image: ONNX Runtime against PyTorch eager.

Each config (``--configs``; default ViT-S/16 + CBT, MiTA and its
full-attention twin) is built with random weights, exported as
``tools/export_onnx.py`` does (fixed input size) to a temporary file and
loaded in ONNX Runtime (CPU). Every (config, runtime) pair gets the same
random image; after one warm-up call each (which also gives the largest
absolute logit difference of the two runtimes), the runs are interleaved
and the best of ``--repeats`` is reported. PyTorch runs under
``torch.inference_mode`` with ``--threads`` threads, ONNX Runtime with as
many intra-op threads. ``ort_vs_torch`` = ONNX Runtime time / PyTorch
time (same model); ``vs_baseline`` = time / the last config's time (same
runtime).
"""
import argparse
import copy
import os.path as osp
import tempfile

import numpy as np
import torch

from mmseg_mita.deploy import (SegmentorLogits, build_segmentor, export_onnx,
                               prepare_for_export)
from mmseg_mita.deploy.export_tool import require_onnx
from mmseg_mita.tools import resolve_config
from .cli import UsageError
from .measure import summarize, time_interleaved
from .record import document, finish
from .report import Column, Table, fixed, milliseconds
from .workloads import image_size

COMMON = dict(repeats=5, time_budget=60.0, threads=2, seed=0)
CONFIGS = [
    'mita-vit-s16_cbt_8xb1-160k_ade20k-512x512',
    'vit-s16_cbt_8xb1-160k_ade20k-512x512',
]
RUNTIMES = ('pytorch', 'onnxruntime')


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--configs', nargs='+', default=CONFIGS,
                        help="configs (files or packaged configs' names) to "
                        'compare; the last is the baseline')
    parser.add_argument('--size', type=image_size, default=(512, 512),
                        metavar='HxW')


def _runners(config: str, size, threads: int, seed: int, folder: str):
    """(PyTorch call, ONNX Runtime call, max |logit difference|) of one
    config on one random image."""
    import onnxruntime as ort
    torch.manual_seed(seed)
    model = build_segmentor(resolve_config(config))
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
    gen = torch.Generator().manual_seed(seed)
    image = torch.randn(1, 3, *size, generator=gen)
    feed = {'inputs': image.numpy()}

    def run_torch():
        with torch.inference_mode():
            return wrapper(image)

    def run_ort():
        return session.run(None, feed)[0]

    diff = float(np.abs(run_torch().numpy() - run_ort()).max())  # warm-up
    return run_torch, run_ort, diff


def run(args: argparse.Namespace) -> int:
    if args.threads < 1:
        raise UsageError('--threads: give the threads of both runtimes '
                         '(>= 1)')
    require_onnx('python -m mmseg_mita.bench onnx')
    doc = document(args)
    calls, diffs = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for config in args.configs:
            run_torch, run_ort, diffs[config] = _runners(
                config, args.size, args.threads, args.seed, folder)
            calls[f'{config}|pytorch'] = run_torch
            calls[f'{config}|onnxruntime'] = run_ort
        times = time_interleaved(calls, torch.device('cpu'), args.repeats,
                                 args.time_budget)
    best = {key: min(t) for key, t in times.items()}
    base = args.configs[-1]
    for config in args.configs:
        for runtime in RUNTIMES:
            key = f'{config}|{runtime}'
            doc['rows'].append(dict(
                config=config, name=osp.splitext(osp.basename(config))[0],
                runtime=runtime, size=list(args.size), **summarize(
                    times[key]),
                ort_vs_torch=best[f'{config}|onnxruntime'] /
                best[f'{config}|pytorch'],
                vs_baseline=best[key] / best[f'{base}|{runtime}'],
                max_abs_logit_diff=diffs[config]))
    finish(doc, args, table)
    return 0


COLUMNS = [
    Column('config', 'name', left=True),
    Column('runtime', 'runtime', left=True),
    milliseconds(digits=0),
    fixed('ORT / PyTorch', 'ort_vs_torch'),
    fixed('vs baseline', 'vs_baseline'),
    Column('max abs logit diff', 'max_abs_logit_diff', '{:.2g}'),
]


table = Table(COLUMNS, notes=[
    'inference of one image, best of the repeats; vs baseline = time / the '
    "last config's time in the same runtime"
])
