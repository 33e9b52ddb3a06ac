"""The ViT-S/16 encoder with MiTA in every layer against full attention.

The encoder is :class:`mmseg_mita.bench.models.ViTEncoder` (12 pre-norm
blocks, 6 heads of 64, embed 384, MLP 4x, 16 x 16 patches, cls token,
learned position embedding), plain PyTorch. Its attention is
``mita_attention(q, k, v, hw, num_extra_tokens=1, pool_size=7, topk=49,
backend=...)`` in every layer (methods ``mita_<backend>``) or
``F.scaled_dot_product_attention`` (``sdpa``). A setting
``KIND:HxW:BATCH`` (``--settings``) is a ``train`` step (forward, a
mean-square loss, backward, AdamW step; float32 weights, the forward under
autocast to ``--dtype`` unless float32) or ``infer`` (forward under
``torch.no_grad`` and autocast) on random images of H x W (N = 1 + H W /
256 tokens).

Modes: ``eager``, and ``compiled``: ``torch.compile(mode=--compile-mode)``
of each block (``--compile-scope blocks``: the blocks share one compiled
graph) or of the whole model (``model``); the optimizer step stays eager.
A failed measurement (a compile, out of memory) is recorded with its
error. All eager measurements come first; the JSON is rewritten after each.
Every measurement starts from the same initial weights; time is the best
of ``--repeats`` runs within ``--time-budget`` seconds after the warm-up;
peak memory is what one run allocates above what was allocated before it.
``time_ratio`` = method time / SDPA time in the same setting and mode
(below 1: MiTA is faster), ``memory_ratio`` likewise.
"""
import argparse
import copy
import sys
import time

import torch
from torch import nn

from .cli import LOW_PRECISION, UsageError, gpu_defaults
from .graphs import (add_compile_options, compiled, graph_breaks, mark_step,
                     reset_compiler)
from .measure import peak_memory, summarize, time_interleaved
from .models import ViTEncoder, mita_attend, sdpa_attention
from .record import document, finish, save
from .report import ERROR, Column, Table, fixed, milliseconds
from .workloads import (ENCODER_SETTINGS, encoder_setting, image_tokens,
                        positive_int)

COMMON = gpu_defaults(repeats=5, time_budget=5.0)
DTYPES = LOW_PRECISION
MODES = ('eager', 'compiled')


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--settings', type=encoder_setting, nargs='+',
                        default=[encoder_setting(s)
                                 for s in ENCODER_SETTINGS],
                        metavar='KIND:HxW:BATCH',
                        help=f'default: {" ".join(ENCODER_SETTINGS)}')
    parser.add_argument('--backends', nargs='+', default=['torch', 'triton'],
                        help='MiTA backends to measure')
    parser.add_argument('--modes', nargs='+', default=list(MODES),
                        choices=MODES)
    add_compile_options(parser)
    parser.add_argument('--compile-scope', default='blocks',
                        choices=('blocks', 'model'),
                        help='compile each block (one shared graph) or the '
                        'whole model')
    for name, default in (('dim', 384), ('depth', 12), ('heads', 6),
                          ('mlp-ratio', 4), ('patch', 16), ('pool-size', 7),
                          ('topk', 49)):
        parser.add_argument(f'--{name}', type=positive_int, default=default)
    parser.add_argument('--lr', type=float, default=1e-4)
    parser.add_argument('--max-seconds', type=float, default=0,
                        help='start no measurement after this many seconds '
                        '(0: no limit)')


def _check(args) -> None:
    if args.dim % args.heads:
        raise UsageError(f'--dim {args.dim} must be a multiple of --heads '
                         f'{args.heads}')
    for s in args.settings:
        if any(x % args.patch for x in s['size']):
            raise UsageError(f'--settings {s["name"]}: H and W must be '
                             f'multiples of --patch {args.patch}')
        grid = [x // args.patch for x in s['size']]
        if min(grid) < args.pool_size:
            raise UsageError(f'--settings {s["name"]}: patch grid {grid} is '
                             f'smaller than --pool-size {args.pool_size}')


def methods(args) -> dict:
    """Method name -> attend(q, k, v, hw)."""
    out = {'sdpa': sdpa_attention}
    for backend in args.backends:
        out[f'mita_{backend}'] = mita_attend(backend, args.pool_size,
                                             args.topk)
    return out


def make_step(setting: dict, model, attend, mode: str, args, device):
    """A warmed-up step (training or inference) of ``model`` and notes."""
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(args.seed)
    images = torch.randn(setting['batch'], 3, *setting['size'],
                         generator=gen).to(device)
    forward = model
    if mode == 'compiled':
        reset_compiler()
        if args.compile_scope == 'blocks':
            model.blocks = nn.ModuleList(
                compiled(block, args.compile_mode, args.compile_backend)
                for block in model.blocks)
        else:
            forward = compiled(model, args.compile_mode, args.compile_backend)

    def autocast():
        return torch.autocast(device.type, dtype=dtype,
                              enabled=dtype != torch.float32)

    if setting['kind'] == 'train':
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

        def step():
            mark_step()
            with autocast():
                out = forward(images, attend)
            out.float().square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    else:
        model.eval()

        def step():
            mark_step()
            with torch.no_grad(), autocast():
                forward(images, attend)

    start = time.perf_counter()
    for _ in range(3 if mode == 'compiled' else 1):
        step()
    notes = dict(warmup_s=time.perf_counter() - start)
    if mode == 'compiled':
        notes['graph_breaks'] = graph_breaks()
    return step, notes


def measure(setting, method, attend, mode, initial, args, device) -> dict:
    row = dict(setting=setting['name'], kind=setting['kind'],
               size=setting['size'], batch=setting['batch'],
               tokens=image_tokens(setting['size'], args.patch),
               method=method, mode=mode)
    try:
        model = copy.deepcopy(initial).to(device)
        step, notes = make_step(setting, model, attend, mode, args, device)
        row.update(notes)
        row.update(summarize(time_interleaved(
            {'step': step}, device, args.repeats, args.time_budget)['step']))
        row['peak_bytes'] = peak_memory(step, device)
        row['images_per_s'] = setting['batch'] / row['best_s']
    except Exception as error:  # e.g. out of memory, a failed compile
        row['error'] = f'{type(error).__name__}: {error}'[:2000]
    if device.type == 'cuda':
        torch.cuda.empty_cache()
    return row


def add_ratios(rows) -> None:
    """``time_ratio`` and ``memory_ratio`` against SDPA, same setting and
    mode."""
    for r in rows:
        sdpa = next((s for s in rows if s['method'] == 'sdpa'
                     and s['setting'] == r['setting']
                     and s['mode'] == r['mode'] and 'best_s' in s), None)
        if sdpa and 'best_s' in r:
            r['time_ratio'] = r['best_s'] / sdpa['best_s']
            r['memory_ratio'] = r['peak_bytes'] / max(sdpa['peak_bytes'], 1)


def run(args: argparse.Namespace) -> int:
    _check(args)
    device = torch.device(args.device)
    doc = document(args, device)
    torch.manual_seed(args.seed)
    initial = ViTEncoder(args.dim, args.depth, args.heads, args.mlp_ratio,
                         args.patch)
    doc['model'] = dict(
        dim=args.dim, depth=args.depth, heads=args.heads,
        head_dim=args.dim // args.heads, mlp_ratio=args.mlp_ratio,
        patch=args.patch, norm='pre', extra_tokens=1, m=args.pool_size**2,
        k=args.topk, dtype=args.dtype,
        parameters=sum(p.numel() for p in initial.parameters()))
    start = time.perf_counter()
    for mode in args.modes:
        for setting in args.settings:
            for method, attend in methods(args).items():
                if args.max_seconds and (time.perf_counter() - start >
                                         args.max_seconds):
                    row = dict(setting=setting['name'], method=method,
                               mode=mode, kind=setting['kind'],
                               tokens=image_tokens(setting['size'],
                                                   args.patch),
                               error=f'skipped: --max-seconds '
                               f'{args.max_seconds:g} spent')
                else:
                    row = measure(setting, method, attend, mode, initial,
                                  args, device)
                doc['rows'].append(row)
                add_ratios(doc['rows'])
                doc['seconds'] = time.perf_counter() - start
                save(doc, args)
                print(f'{setting["name"]} {method} {mode}: '
                      f'{row.get("best_s", float("nan")) * 1e3:.1f} ms'
                      f'{" " + row["error"] if "error" in row else ""}',
                      file=sys.stderr, flush=True)
    finish(doc, args, table)
    return 0


COLUMNS = [
    Column('setting', 'setting', left=True),
    Column('N', 'tokens'),
    Column('method', 'method', left=True),
    Column('mode', 'mode', left=True),
    milliseconds(digits=1),
    fixed('x SDPA time', 'time_ratio'),
    Column('peak MiB', 'peak_bytes', lambda v: f'{v / 2**20:.1f}'),
    fixed('x SDPA mem', 'memory_ratio'),
    ERROR,
]
table = Table(COLUMNS, notes=[
    'x SDPA = method / the SDPA encoder in the same setting and mode (below '
    '1: MiTA faster or smaller); best run'
])
