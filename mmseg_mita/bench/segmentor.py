"""Whole segmentors, MiTA against its SDPA twin: images/s and memory.

The numbers of mmseg's model zoo (fps, Mem (GB)) for the ViT-S/16 configs
(``--heads``: UPerNet, CBT) on each workload (``--workloads``, from
:data:`mmseg_mita.bench.workloads.SEGMENTOR_WORKLOADS`): inference of one
image (mmseg's ``predict``: whole image, or the sliding window, logits
resized and argmax) at 512 x 512, 640 x 640 (the ADE20K config) and
1024 x 2048 (the Cityscapes config, whole and slide with 1024 x 1024
windows at stride 768); and one training iteration at 512 x 512 (forward,
the losses on random labels, backward, the config's optimizer step, on a
batch of the config's size per GPU). Each in each ``--modes``: ``eager``
and ``compiled`` (:func:`mmseg_mita.models.compile.compile_network`, what
the config switch ``compile=True`` compiles: the forward of the backbone,
neck and heads; ``--compile-backend``, ``--compile-mode``).

Models have random weights (nothing is downloaded). After the warm-up (three
steps compiled, one eager) the step's peak memory is measured, then the
steps of all models of a workload are timed interleaved (same machine
load), best of ``--repeats``. ``fps`` = images / best step time; ``Mem
(GB)`` = the parameters and buffers (and the optimizer's state when
training) plus the peak the step allocates above what was allocated before
it (on CPU through PyTorch's allocator, :mod:`.measure`). Every row names
its device. ``--scale-down F`` divides every size by F (quick checks with
``--cfg-options`` shrinking the models).
"""
import argparse
import sys
import time

import torch
from mmengine.config import DictAction
from mmengine.optim import build_optim_wrapper

from mmseg_mita.models.compile import compile_network
from .cli import UsageError
from .graphs import (add_compile_options, compile_options, graph_breaks,
                     reset_compiler)
from .measure import peak_memory, summarize, tensor_bytes, time_interleaved
from .record import device_name, document, finish, save
from .report import ERROR, Column, Table, fixed, significant
from .segmentors import (attention_variants, build, inference_step,
                         load_config, random_images, training_step)
from .workloads import (HEADS, SEGMENTOR_CONFIGS, SEGMENTOR_WORKLOADS,
                        positive_int)

COMMON = dict(device='cpu', repeats=3, time_budget=60.0, threads=0, seed=0)
MODES = ('eager', 'compiled')


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--heads', nargs='+', default=list(HEADS),
                        choices=list(HEADS))
    parser.add_argument('--workloads', nargs='+',
                        default=list(SEGMENTOR_WORKLOADS),
                        choices=list(SEGMENTOR_WORKLOADS))
    parser.add_argument('--attentions', nargs='+', default=['mita', 'sdpa'],
                        choices=['mita', 'sdpa', 'mmseg'],
                        help="MiTA, its SDPA twin, mmseg's ViT")
    parser.add_argument('--modes', nargs='+', default=list(MODES),
                        choices=MODES)
    add_compile_options(parser, mode='default')
    parser.add_argument('--scale-down', type=positive_int, default=1,
                        help='divide every image, window and stride size by '
                        'this (quick checks)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings of every config')


def _prepare(model, cfg, workload, mode, args, device):
    """The warmed-up step of ``model`` for ``workload`` in ``mode``, and
    its notes: batch, optimizer, the bytes it keeps (weights, state)."""
    train = workload.kind == 'train'
    batch = cfg.train_dataloader.batch_size if train else 1
    images = random_images(batch, workload.size, args.seed, device)
    notes = dict(batch=batch)
    kept = list(model.parameters()) + list(model.buffers())
    if mode == 'compiled':
        compile_network(model, **compile_options(args.compile_mode,
                                                 args.compile_backend))
    if train:
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
        notes['optimizer'] = type(optim_wrapper.optimizer).__name__
        step = training_step(model, images, args.seed, optim_wrapper)
    else:
        step = inference_step(model, images, predict=True)
    before = graph_breaks()
    start = time.perf_counter()
    for _ in range(3 if mode == 'compiled' else 1):
        step()
    notes['warmup_s'] = time.perf_counter() - start
    if mode == 'compiled':
        notes['graph_breaks'] = graph_breaks() - before
    if train:
        state = optim_wrapper.optimizer.state.values()
        kept += [t for s in state for t in s.values()]
    notes['kept_bytes'] = tensor_bytes(kept)
    return step, notes


def measure_workload(name, head, args, device) -> list:
    """The rows of one workload and head: every attention in every mode."""
    workload = SEGMENTOR_WORKLOADS[name].scaled_down(args.scale_down)
    config = SEGMENTOR_CONFIGS[(head, workload.dataset)]
    cfg = load_config(config, args.cfg_options)
    if workload.kind == 'slide':
        cfg.model.test_cfg = dict(mode='slide', crop_size=workload.crop,
                                  stride=workload.stride)
    else:
        cfg.model.test_cfg = dict(mode='whole')
    reset_compiler()
    variants = attention_variants(cfg)
    rows, steps = {}, {}
    for attention in args.attentions:
        for mode in args.modes:
            row = rows[(attention, mode)] = dict(
                head=head, workload=name, dataset=workload.dataset,
                kind=workload.kind, size=list(workload.size),
                crop=workload.crop, stride=workload.stride, config=config,
                attention=attention, mode=mode, device=device_name(device))
            try:
                torch.manual_seed(args.seed)  # the same weights per twin
                model = build(variants[attention], device)
                step, notes = _prepare(model, variants[attention], workload,
                                       mode, args, device)
                row.update(notes)
                row['peak_step_bytes'] = peak_memory(step, device)
                row['mem_bytes'] = row['kept_bytes'] + row['peak_step_bytes']
                steps[(attention, mode)] = step
            except Exception as error:  # recorded; the others still run
                row['error'] = f'{type(error).__name__}: {error}'[:2000]
            print(f'{head} {name} {attention} {mode}: warm '
                  f'{row.get("error", "")}', file=sys.stderr, flush=True)
    times = time_interleaved({str(k): s for k, s in steps.items()}, device,
                             args.repeats, args.time_budget)
    for key in steps:
        row = rows[key]
        row.update(summarize(times[str(key)]))
        row['fps'] = row['batch'] / row['best_s']
    _add_ratios(list(rows.values()))
    if device.type == 'cuda':
        torch.cuda.empty_cache()
    return list(rows.values())


def _add_ratios(rows) -> None:
    """``fps_vs_sdpa`` (same mode) and ``compiled_speedup`` (same
    attention): fps over fps."""
    fps = {(r['attention'], r['mode']): r['fps'] for r in rows if 'fps' in r}
    for r in rows:
        if 'fps' not in r:
            continue
        sdpa = fps.get(('sdpa', r['mode']))
        if sdpa:
            r['fps_vs_sdpa'] = r['fps'] / sdpa
        eager = fps.get((r['attention'], 'eager'))
        if r['mode'] == 'compiled' and eager:
            r['compiled_speedup'] = r['fps'] / eager


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise UsageError('--device cuda: no CUDA device here; use --device '
                         'cpu')
    doc = document(args, device)
    start = time.perf_counter()
    for name in args.workloads:
        for head in args.heads:
            doc['rows'] += measure_workload(name, head, args, device)
            doc['seconds'] = time.perf_counter() - start
            save(doc, args)
    finish(doc, args, table)
    return 0


def _input(r) -> str:
    text = f'{r["size"][0]}x{r["size"][1]}'
    if r['kind'] == 'slide':
        text += f' (slide {r["crop"][0]}x{r["crop"][1]}, stride ' \
                f'{r["stride"][0]}x{r["stride"][1]})'
    return text


def _step(r) -> str:
    if r['kind'] == 'train':
        return f'train ({r.get("optimizer", "?")})'
    return 'inference'


COLUMNS = [
    Column('Method', lambda r: HEADS[r['head']][0], left=True),
    Column('Backbone', lambda r: HEADS[r['head']][1], left=True),
    Column('Attention', lambda r: {'mita': 'MiTA (m = k = 49)',
                                   'sdpa': 'full (SDPA)',
                                   'mmseg': "full (mmseg's ViT)"}[
                                       r['attention']], left=True),
    Column('Input', _input, left=True),
    Column('Step', _step, left=True),
    Column('Batch', 'batch'),
    Column('torch.compile', lambda r: 'yes' if r['mode'] == 'compiled'
           else 'no', left=True),
    Column('Device', 'device', left=True),
    significant('fps', 'fps'),
    Column('Mem (GB)', 'mem_bytes', lambda v: f'{v / 1e9:.2f}'),
    fixed('fps / SDPA', 'fps_vs_sdpa'),
    fixed('compiled / eager', 'compiled_speedup'),
    ERROR,
]
table = Table(COLUMNS, notes=[
    'fps: images / s (best of the repeats; training: images of the batch '
    'per iteration); Mem (GB): weights, buffers and optimizer state plus '
    'the peak the step allocates; fps / SDPA: over the SDPA twin in the same '
    "mode; compiled / eager: fps over the same model's eager fps"
])
