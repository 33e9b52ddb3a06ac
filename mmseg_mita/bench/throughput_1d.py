"""Inference throughput on long 1-D sequences: MiTA against full attention.

The paper's throughput setting: ``--depth`` (3) pre-norm Transformer
blocks of width ``--dim`` (128) with ``--heads`` (2) heads of ``dim /
heads`` (64) channels and an MLP of ratio ``--mlp-ratio`` (4, GELU)
(:class:`mmseg_mita.bench.models.Transformer1d`), on one sequence of N
tokens (batch 1), random embeddings, no extra (cls) token. MiTA sees the
tokens as a 1 x N grid: its m landmarks are the average pooling of the
queries along the sequence into m segments (``pool_size = (1, m)``), each
routed expert keeps k keys. ``--mk`` lists the (m, k) settings: an int sets
m = k to it; ``quarter`` sets m = k = round(sqrt(N / 4)) (m k close to
N / 4: 128, 256 and 512 at 64K, 256K and 1M tokens). Full attention is
``F.scaled_dot_product_attention`` in the same model. MiTA runs once
untimed at every N (Triton compiles there), full attention once at
``--warmup-tokens``; each measurement repeats forward passes under
``torch.inference_mode`` until ``--repeats`` runs or ``--time-budget``
seconds; tokens/s from the best run, ``speedup_vs_sdpa`` at the same N.
"""
import argparse
import math
import sys
import time

import torch
import torch.nn.functional as F

from mmseg_mita.ops import mita_attention
from .cli import LOW_PRECISION, UsageError, gpu_defaults
from .measure import run_timed, summarize, synchronize
from .models import Transformer1d
from .record import document, finish, save
from .report import ERROR, Column, Table, fixed, milliseconds
from .workloads import THROUGHPUT_TOKENS, positive_int

COMMON = gpu_defaults(repeats=5, time_budget=20.0)
DTYPES = LOW_PRECISION


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--tokens', type=positive_int, nargs='+',
                        default=list(THROUGHPUT_TOKENS))
    parser.add_argument('--mk', type=parse_mk, nargs='+',
                        default=[49, 'quarter'],
                        help="m = k settings: ints, or 'quarter' for "
                        'm = k = round(sqrt(N / 4))')
    parser.add_argument('--backends', nargs='+', default=['triton', 'torch'],
                        help='MiTA backends to measure')
    parser.add_argument('--no-sdpa', action='store_true',
                        help='skip full attention (no speed-ups then)')
    for name, default in (('dim', 128), ('depth', 3), ('heads', 2),
                          ('mlp-ratio', 4), ('warmup-tokens', 4096)):
        parser.add_argument(f'--{name}', type=positive_int, default=default)


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
    row = summarize(times)
    if device.type == 'cuda':
        row['peak_bytes'] = torch.cuda.max_memory_allocated(device) - before
    return row


def warm_up(model, x, backend, mk, warm: set, args) -> None:
    """One untimed run: MiTA at this N (Triton compiles per block size,
    which depends on N / m), full attention once at ``--warmup-tokens``."""
    n = x.shape[1]
    if backend is None:
        if 'sdpa' in warm:
            return
        warm.add('sdpa')
        n = min(args.warmup_tokens, n)
    with torch.inference_mode():
        model(x[:, :n], attention(backend, mk, n))


def run(args: argparse.Namespace) -> int:
    if args.dim % args.heads:
        raise UsageError(f'--dim {args.dim} must be a multiple of --heads '
                         f'{args.heads}')
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    doc = document(args, device)
    doc['model'] = dict(depth=args.depth, dim=args.dim, heads=args.heads,
                        head_dim=args.dim // args.heads,
                        mlp_ratio=args.mlp_ratio, norm='pre', batch=1,
                        extra_tokens=0, grid='1 x N', dtype=args.dtype)
    torch.manual_seed(args.seed)
    model = Transformer1d(args.dim, args.depth, args.heads,
                          args.mlp_ratio).to(device, dtype).eval()
    start, warm = time.perf_counter(), set()
    rows = doc['rows']
    for n in args.tokens:
        x = torch.randn(1, n, args.dim, device=device, dtype=dtype)
        for name, backend, mk in methods(args, n):
            row = dict(tokens=n, method=name, backend=backend, m=mk, k=mk)
            try:
                warm_up(model, x, backend, mk, warm, args)
                row.update(measure(model, x, attention(backend, mk, n),
                                   device, args))
                row['tokens_per_s'] = n / row['best_s']
            except Exception as error:  # e.g. out of memory: keep going
                row['error'] = f'{type(error).__name__}: {error}'
                if device.type == 'cuda':
                    torch.cuda.empty_cache()
            rows.append(row)
            print(f'N={n} {name}{"" if mk is None else f" m=k={mk}"}: '
                  f'{row.get("tokens_per_s", float("nan")):.0f} tokens/s'
                  f'{" " + row["error"] if "error" in row else ""}',
                  file=sys.stderr, flush=True)
        sdpa = next((r for r in rows if r['tokens'] == n
                     and r['method'] == 'sdpa' and 'best_s' in r), None)
        for r in rows:
            if r['tokens'] == n and sdpa and 'best_s' in r:
                r['speedup_vs_sdpa'] = sdpa['best_s'] / r['best_s']
        doc['seconds'] = time.perf_counter() - start
        save(doc, args)
    finish(doc, args, table)
    return 0


COLUMNS = [
    Column('N', 'tokens'),
    Column('method', 'method', left=True),
    Column('m', 'm'),
    Column('k', 'k'),
    milliseconds(),
    Column('tokens/s', 'tokens_per_s', '{:.0f}'),
    fixed('x SDPA', 'speedup_vs_sdpa', 1),
    ERROR,
]
table = Table(COLUMNS, notes=[
    'x SDPA = full-attention time / method time at the same N (best run; '
    'batch 1, inference)'
])
