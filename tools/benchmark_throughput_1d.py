"""Inference throughput of a small Transformer on long 1-D sequences:
MiTA against full attention (the paper's throughput setting).

    python tools/benchmark_throughput_1d.py [--device cuda] [--dtype bfloat16]
        [--tokens 65536 262144 1048576] [--mk 49 quarter]
        [--backends triton torch] [--time-budget 20] [--json out.json]

The model: ``--depth`` (3) pre-norm Transformer blocks of width ``--dim``
(128) with ``--heads`` (2) heads of ``dim / heads`` (64) channels and an MLP
of ratio ``--mlp-ratio`` (4, GELU), on one sequence of N tokens (batch 1),
random embeddings, no extra (cls) token. MiTA sees the tokens as a 1 x N
grid: its m landmarks are the average pooling of the queries along the
sequence into m segments (``pool_size = (1, m)``), each routed expert keeps
k keys. ``--mk`` lists the (m, k) settings: an int sets m = k to it;
``quarter`` sets m = k = round(sqrt(N / 4)), so that m * k is close to N / 4
(m = k = 128, 256 and 512 at 64K, 256K and 1M tokens). Full attention is
``F.scaled_dot_product_attention`` (flash/cuDNN kernels on CUDA) in the same
model. MiTA runs once untimed at every N (Triton compiles there), full
attention once at ``--warmup-tokens``; then each measurement repeats
forward passes (under ``torch.inference_mode``) until ``--repeats`` runs or
``--time-budget`` seconds; tokens/s come from the best run. The JSON holds
every measurement; the printed table gives tokens/s and the speed-up over
full attention at the same N.
"""
import argparse
import math
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from mmseg_mita.benchmarks import (DTYPES, add_measuring_options, run_timed,
                                   start_measuring, summarize, synchronize)
from mmseg_mita.benchmarks.encoder import Block
from mmseg_mita.ops import mita_attention
from mmseg_mita.utils import write_json


class Transformer1d(nn.Module):

    def __init__(self, dim: int, depth: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.blocks = nn.ModuleList(
            Block(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x, attend):
        for block in self.blocks:
            x = block(x, attend)
        return self.norm(x)


def parse_mk(value: str):
    if value == 'quarter':
        return value
    try:
        mk = int(value)
    except ValueError:
        mk = 0
    if mk < 1:
        raise argparse.ArgumentTypeError(
            f"--mk takes ints >= 1 or 'quarter', got {value!r}")
    return mk


def resolve_mk(setting, tokens: int) -> int:
    """m = k of a ``--mk`` setting at ``tokens`` tokens (at most N)."""
    if setting == 'quarter':
        setting = max(1, round(math.sqrt(tokens / 4)))
    return min(setting, tokens)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='1-D Transformer inference throughput: MiTA vs SDPA')
    parser.add_argument('--tokens', type=int, nargs='+',
                        default=[65536, 262144, 1048576])
    parser.add_argument('--mk', type=parse_mk, nargs='+',
                        default=[49, 'quarter'],
                        help="m = k settings: ints, or 'quarter' for "
                        'm = k = round(sqrt(N / 4))')
    parser.add_argument('--backends', nargs='+', default=['triton', 'torch'],
                        help='MiTA backends to measure')
    parser.add_argument('--no-sdpa', action='store_true',
                        help='skip full attention (no speed-ups then)')
    parser.add_argument('--dim', type=int, default=128)
    parser.add_argument('--depth', type=int, default=3)
    parser.add_argument('--heads', type=int, default=2)
    parser.add_argument('--mlp-ratio', type=int, default=4)
    add_measuring_options(parser, repeats=5, time_budget=20.0,
                          device='cuda', dtype='bfloat16',
                          dtypes=('float32', 'float16', 'bfloat16'))
    parser.add_argument('--warmup-tokens', type=int, default=4096)
    args = parser.parse_args(argv)
    for name in ('dim', 'depth', 'heads', 'mlp_ratio', 'repeats',
                 'warmup_tokens'):
        if getattr(args, name) < 1:
            parser.error(f'--{name.replace("_", "-")} must be >= 1')
    if args.dim % args.heads:
        parser.error(f'--dim {args.dim} must be a multiple of --heads '
                     f'{args.heads}')
    if min(args.tokens) < 1:
        parser.error('--tokens must be >= 1')
    return args


def methods(args, tokens: int):
    """(name, backend, m = k) of every measurement at ``tokens``."""
    out = [] if args.no_sdpa else [('sdpa', None, None)]
    for setting in args.mk:
        mk = resolve_mk(setting, tokens)
        for backend in args.backends:
            out.append((f'mita_{backend}', backend, mk))
    return out


def attention(backend, mk, tokens: int):
    if backend is None:
        return F.scaled_dot_product_attention
    return lambda q, k, v: mita_attention(
        q, k, v, (1, tokens), num_extra_tokens=0, pool_size=(1, mk),
        topk=mk, backend=backend)


def measure(model, x, attend, device, args) -> dict:
    """Best-of timing of ``model(x)`` within the time budget."""
    def run():
        with torch.inference_mode():
            model(x, attend)

    if device.type == 'cuda':
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    times = []
    while len(times) < args.repeats and sum(times) < args.time_budget:
        times.append(run_timed(run, device))
    record = summarize(times)
    if device.type == 'cuda':
        record['peak_bytes'] = torch.cuda.max_memory_allocated(
            device) - before
    return record


def warm_up(model, x, backend, mk, warm: set, args) -> None:
    """One untimed run: MiTA at this N (Triton compiles per block size,
    which depends on N / m), full attention once at ``--warmup-tokens``
    (one run at 1M tokens costs seconds)."""
    n = x.shape[1]
    if backend is None:
        if 'sdpa' in warm:
            return
        warm.add('sdpa')
        n = min(args.warmup_tokens, n)
    with torch.inference_mode():
        model(x[:, :n], attention(backend, mk, n))


def bench(args, device) -> list:
    dtype = DTYPES[args.dtype]
    torch.manual_seed(args.seed)
    model = Transformer1d(args.dim, args.depth, args.heads,
                          args.mlp_ratio).to(device, dtype).eval()
    records = []
    warm = set()
    for n in args.tokens:
        x = torch.randn(1, n, args.dim, device=device, dtype=dtype)
        for name, backend, mk in methods(args, n):
            record = dict(tokens=n, method=name, backend=backend, m=mk,
                          k=mk)
            try:
                warm_up(model, x, backend, mk, warm, args)
                record.update(measure(model, x, attention(backend, mk, n),
                                      device, args))
                record['tokens_per_s'] = n / record['best_s']
            except Exception as error:  # e.g. out of memory: keep going
                record['error'] = f'{type(error).__name__}: {error}'
                if device.type == 'cuda':
                    torch.cuda.empty_cache()
            records.append(record)
            print(f'N={n} {name}{"" if mk is None else f" m=k={mk}"}: '
                  f'{record.get("tokens_per_s", float("nan")):.0f} tokens/s'
                  f'{" " + record["error"] if "error" in record else ""}',
                  file=sys.stderr, flush=True)
        sdpa = next((r for r in records if r['tokens'] == n
                     and r['method'] == 'sdpa' and 'best_s' in r), None)
        for r in records:
            if r['tokens'] == n and sdpa and 'best_s' in r:
                r['speedup_vs_sdpa'] = sdpa['best_s'] / r['best_s']
    return records


def format_table(records) -> str:
    lines = [f'{"N":>8} | {"method":<12} | {"m":>4} {"k":>4} | '
             f'{"ms":>10} | {"tokens/s":>12} | {"x SDPA":>7}']
    for r in records:
        mk = ('-', '-') if r['m'] is None else (r['m'], r['k'])
        if 'error' in r:
            lines.append(f'{r["tokens"]:>8} | {r["method"]:<12} | '
                         f'{mk[0]:>4} {mk[1]:>4} | failed: {r["error"]}')
            continue
        speedup = r.get('speedup_vs_sdpa')
        lines.append(
            f'{r["tokens"]:>8} | {r["method"]:<12} | {mk[0]:>4} {mk[1]:>4} | '
            f'{r["best_s"] * 1e3:>10.2f} | {r["tokens_per_s"]:>12.0f} | '
            f'{"-" if speedup is None else f"{speedup:.1f}":>7}')
    lines.append('x SDPA = full-attention time / method time at the same N '
                 '(best run; batch 1, inference)')
    return '\n'.join(lines)


def main(argv=None):
    args = parse_args(argv)
    device, info = start_measuring(args)
    start = time.perf_counter()
    records = bench(args, device)
    model = dict(depth=args.depth, dim=args.dim, heads=args.heads,
                 head_dim=args.dim // args.heads, mlp_ratio=args.mlp_ratio,
                 norm='pre', batch=1, extra_tokens=0, grid='1 x N',
                 dtype=args.dtype)
    print(format_table(records))
    result = dict(machine=info, args=vars(args), model=model,
                  seconds=time.perf_counter() - start, results=records)
    if args.json:
        write_json(result, args.json)
    return result


if __name__ == '__main__':
    main()
