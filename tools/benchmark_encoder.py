"""A ViT-S/16 encoder with MiTA in every layer against the same encoder
with full attention: training step and inference, time and peak memory.

    python tools/benchmark_encoder.py [--device cuda] [--dtype bfloat16]
        [--settings train:512x512:8 train:1024x1024:2 infer:1024x2048:1]
        [--backends torch triton] [--modes eager compiled]
        [--json out.json]

The encoder is :class:`mmseg_mita.benchmarks.encoder.ViTEncoder` (12
pre-norm blocks, 6 heads of 64, embed 384, MLP 4x, 16 x 16 patches, cls
token, learned position embedding), plain PyTorch. Its attention is
``mita_attention(q, k, v, hw, num_extra_tokens=1, pool_size=7, topk=49,
backend=...)`` in every layer (methods ``mita_<backend>``) or
``F.scaled_dot_product_attention`` (``sdpa``). A setting
``KIND:HxW:BATCH`` is a ``train`` step (forward, a mean-square loss,
backward, AdamW step; parameters in float32, the forward under autocast
to ``--dtype`` unless float32) or ``infer`` (forward under
``torch.no_grad`` and autocast) on random images of H x W (N = 1 + H W /
256 tokens: 1025 at 512 x 512, 4097 at 1024 x 1024, 8193 at 1024 x 2048).

Modes: ``eager``, and ``compiled``: ``torch.compile(mode=--compile-mode)``
of each block (``--compile-scope blocks``: the 12 blocks share one
compiled graph, so one compile, about a twelfth of the whole model's; the
patch embedding and final norm stay eager) or of the whole model
(``model``); the optimizer step stays eager. A compile that fails is
recorded with its error (the eager numbers stand). All eager measurements
come first, so a run cut short loses compiled ones first; the JSON is
rewritten after each measurement. Every measurement starts from the same
initial weights; time is the best of ``--repeats`` runs within
``--time-budget`` seconds after the warm-up; peak memory is what one run
allocates above what was allocated before it (model, optimizer state and
inputs excluded). ``time_ratio`` = method time / SDPA time in the same
setting and mode (below 1: MiTA is faster), ``memory_ratio`` likewise.
"""
import argparse
import copy
import sys
import time

import torch
from torch import nn

from mmseg_mita.benchmarks import (DTYPES, add_deadline_option,
                                   add_measuring_options, peak_memory,
                                   start_measuring, summarize,
                                   time_interleaved)
from mmseg_mita.benchmarks.encoder import (ViTEncoder, mita_attend,
                                           sdpa_attention)
from mmseg_mita.benchmarks.graphs import (add_compile_options, compiled,
                                          graph_breaks, mark_step,
                                          reset_compiler)
from mmseg_mita.utils import write_json

SETTINGS = ('train:512x512:8', 'train:1024x1024:2', 'infer:1024x2048:1')
MODES = ('eager', 'compiled')


def parse_setting(value: str) -> dict:
    try:
        kind, size, batch = value.split(':')
        h, w = (int(s) for s in size.split('x'))
        batch = int(batch)
    except ValueError:
        kind, h, w, batch = '', 0, 0, 0
    if kind not in ('train', 'infer') or min(h, w, batch) < 1:
        raise argparse.ArgumentTypeError(
            f'--settings takes train|infer:HxW:BATCH, e.g. train:512x512:8, '
            f'got {value!r}')
    return dict(kind=kind, size=[h, w], batch=batch, name=value)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='ViT-S encoder: MiTA vs SDPA, training and inference')
    parser.add_argument('--settings', type=parse_setting, nargs='+',
                        default=[parse_setting(s) for s in SETTINGS])
    parser.add_argument('--backends', nargs='+', default=['torch', 'triton'],
                        help='MiTA backends to measure')
    parser.add_argument('--modes', nargs='+', default=list(MODES),
                        choices=MODES)
    add_compile_options(parser)
    parser.add_argument('--compile-scope', default='blocks',
                        choices=('blocks', 'model'),
                        help='compile each block (the blocks share one '
                        'compiled graph: one compile) or the whole model')
    parser.add_argument('--dim', type=int, default=384)
    parser.add_argument('--depth', type=int, default=12)
    parser.add_argument('--heads', type=int, default=6)
    parser.add_argument('--mlp-ratio', type=int, default=4)
    parser.add_argument('--patch', type=int, default=16)
    parser.add_argument('--pool-size', type=int, default=7)
    parser.add_argument('--topk', type=int, default=49)
    parser.add_argument('--lr', type=float, default=1e-4)
    add_deadline_option(parser, 'measurement')
    add_measuring_options(parser, repeats=5, time_budget=5.0,
                          device='cuda', dtype='bfloat16',
                          dtypes=('float32', 'float16', 'bfloat16'))
    args = parser.parse_args(argv)
    for name in ('dim', 'depth', 'heads', 'mlp_ratio', 'patch', 'pool_size',
                 'topk', 'repeats'):
        if getattr(args, name) < 1:
            parser.error(f'--{name.replace("_", "-")} must be >= 1')
    if args.dim % args.heads:
        parser.error(f'--dim {args.dim} must be a multiple of --heads '
                     f'{args.heads}')
    for s in args.settings:
        grid = [x // args.patch for x in s['size']]
        if min(grid) < args.pool_size:
            parser.error(f'--settings {s["name"]}: patch grid {grid} is '
                         f'smaller than --pool-size {args.pool_size}')
    return args


def tokens(setting: dict, args) -> int:
    """Tokens of a setting: the cls token and the patches."""
    h, w = setting['size']
    return 1 + (h // args.patch) * (w // args.patch)


def methods(args) -> dict:
    """Method name -> attend(q, k, v, hw)."""
    out = {'sdpa': sdpa_attention}
    for backend in args.backends:
        out[f'mita_{backend}'] = mita_attend(backend, args.pool_size,
                                             args.topk)
    return out


def make_step(setting: dict, model, attend, mode: str, args, device):
    """A warmed-up step (training or inference) of ``model`` and notes."""
    dtype = DTYPES[args.dtype]
    gen = torch.Generator(device='cpu').manual_seed(args.seed)
    images = torch.randn(setting['batch'], 3, *setting['size'],
                         generator=gen).to(device)
    forward = model
    notes = {}
    if mode == 'compiled':
        reset_compiler()
        if args.compile_scope == 'blocks':  # one compile serves all 12
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
    notes['warmup_s'] = time.perf_counter() - start
    if mode == 'compiled':
        notes['graph_breaks'] = graph_breaks()
    return step, notes


def measure(setting, method, attend, mode, initial, args, device) -> dict:
    record = dict(setting=setting['name'], kind=setting['kind'],
                  size=setting['size'], batch=setting['batch'],
                  tokens=tokens(setting, args),
                  method=method, mode=mode)
    try:
        model = copy.deepcopy(initial).to(device)
        step, notes = make_step(setting, model, attend, mode, args, device)
        record.update(notes)
        record.update(summarize(time_interleaved(
            {'step': step}, device, args.repeats, args.time_budget)['step']))
        record['peak_bytes'] = peak_memory(step, device)
        record['images_per_s'] = setting['batch'] / record['best_s']
    except Exception as error:  # e.g. out of memory, a failed compile
        record['error'] = f'{type(error).__name__}: {error}'[:2000]
    if device.type == 'cuda':
        torch.cuda.empty_cache()
    return record


def add_ratios(records) -> None:
    """``time_ratio`` and ``memory_ratio`` against SDPA, same setting and
    mode."""
    for r in records:
        sdpa = next((s for s in records if s['method'] == 'sdpa'
                     and s['setting'] == r['setting']
                     and s['mode'] == r['mode'] and 'best_s' in s), None)
        if sdpa and 'best_s' in r:
            r['time_ratio'] = r['best_s'] / sdpa['best_s']
            r['memory_ratio'] = r['peak_bytes'] / max(sdpa['peak_bytes'], 1)


def format_table(records) -> str:
    lines = [f'{"setting":<20} {"N":>5} | {"method":<12} | {"mode":<8} | '
             f'{"ms":>9} | {"x SDPA time":>11} | {"peak MiB":>9} | '
             f'{"x SDPA mem":>10}']
    for r in records:
        head = (f'{r["setting"]:<20} {r["tokens"]:>5} | {r["method"]:<12} | '
                f'{r["mode"]:<8} |')
        if 'error' in r:
            lines.append(f'{head} failed: {r["error"][:80]}')
            continue
        lines.append(
            f'{head} {r["best_s"] * 1e3:>9.1f} | '
            f'{r.get("time_ratio", float("nan")):>11.2f} | '
            f'{r["peak_bytes"] / 2**20:>9.1f} | '
            f'{r.get("memory_ratio", float("nan")):>10.2f}')
    lines.append('x SDPA = method / the SDPA encoder in the same setting and '
                 'mode (below 1: MiTA faster or smaller); best run')
    return '\n'.join(lines)


def main(argv=None):
    args = parse_args(argv)
    device, info = start_measuring(args)
    torch.manual_seed(args.seed)
    initial = ViTEncoder(args.dim, args.depth, args.heads, args.mlp_ratio,
                         args.patch)
    model = dict(dim=args.dim, depth=args.depth, heads=args.heads,
                 head_dim=args.dim // args.heads, mlp_ratio=args.mlp_ratio,
                 patch=args.patch, norm='pre', extra_tokens=1,
                 m=args.pool_size**2, k=args.topk, dtype=args.dtype,
                 parameters=sum(p.numel() for p in initial.parameters()))
    start = time.perf_counter()
    result = dict(machine=info, args=vars(args), model=model, results=[])
    for mode in args.modes:
        for setting in args.settings:
            for method, attend in methods(args).items():
                elapsed = time.perf_counter() - start
                if args.max_seconds and elapsed > args.max_seconds:
                    record = dict(setting=setting['name'], method=method,
                                  mode=mode, kind=setting['kind'],
                                  tokens=tokens(setting, args),
                                  error=f'skipped: --max-seconds '
                                  f'{args.max_seconds:g} spent')
                else:
                    record = measure(setting, method, attend, mode, initial,
                                     args, device)
                result['results'].append(record)
                add_ratios(result['results'])
                result['seconds'] = time.perf_counter() - start
                if args.json:
                    write_json(result, args.json)
                print(f'{setting["name"]} {method} {mode}: '
                      f'{record.get("best_s", float("nan")) * 1e3:.1f} ms'
                      f'{" " + record["error"] if "error" in record else ""}',
                      file=sys.stderr, flush=True)
    print(format_table(result['results']))
    return result


if __name__ == '__main__':
    main()
