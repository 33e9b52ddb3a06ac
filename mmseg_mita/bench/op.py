"""MiTA attention against full attention: time and peak memory against N.

For every N (``--tokens``: ``--extra-tokens`` cls tokens and the most
square patch grid), on the same random q, k, v and in the same run:
``mita_attention`` (m = ``--pool-size``^2 landmarks, k = ``--topk`` routed
keys) with each of ``--backends`` (methods ``mita_<backend>``) and
``F.scaled_dot_product_attention`` (``sdpa``), the forward under
``torch.no_grad`` and forward+backward: time (best of ``--repeats``, the
runs of all calls interleaved so that they see the same machine load) and
peak memory (bytes allocated above the inputs; :mod:`.measure`).
``x SDPA`` = SDPA time / method time. The memory run is also the warm-up,
and the only timing of a call slower than ``--time-budget`` (``*``).

``--experts-per-query S`` (S > 1) also measures MiTA with S routed experts
per query (``mita_s<S>``, first backend), beside the ratio of keys each
query sees, ``(m + S k) / (m + k)``.
"""
import argparse
import sys
from typing import Callable, Dict

import torch
import torch.nn.functional as F

from mmseg_mita.ops import mita_attention
from .cli import UsageError
from .measure import (load_average, peak_memory, run_timed, summarize,
                      time_interleaved)
from .record import document, finish, save
from .report import Column, Curve, Panel, Table, fixed, plot_panels
from .workloads import OP_TOKENS, check_grid, patch_grid, positive_int

COMMON = dict(device='cpu', dtype='float32', repeats=3, time_budget=120.0,
              threads=0, seed=0)
MODES = ('forward', 'forward_backward')


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--tokens', type=positive_int, nargs='+',
                        default=list(OP_TOKENS),
                        help='sequence lengths N (default: %(default)s)')
    parser.add_argument('--extra-tokens', type=int, default=1)
    parser.add_argument('--batch', type=positive_int, default=1)
    parser.add_argument('--heads', type=positive_int, default=6)
    parser.add_argument('--single-head-from', type=int, default=16385,
                        help='one head from this N on (0: never)')
    parser.add_argument('--head-dim', type=positive_int, default=64)
    parser.add_argument('--pool-size', type=positive_int, default=7,
                        help='landmark grid side; m = pool_size ** 2')
    parser.add_argument('--topk', type=positive_int, default=49)
    parser.add_argument('--backends', nargs='+', default=['auto'],
                        metavar='BACKEND',
                        help='mita_attention backends (auto, torch, '
                        'triton, flash, export)')
    parser.add_argument('--experts-per-query', type=positive_int, default=1,
                        help='also MiTA with this many routed experts per '
                        'query (at most pool_size ** 2)')


def _check(args) -> None:
    if args.experts_per_query > args.pool_size**2:
        raise UsageError(
            f'--experts-per-query {args.experts_per_query}: at most the '
            f'number of experts pool_size ** 2 = {args.pool_size**2}')
    for n in args.tokens:
        check_grid(patch_grid(n, args.extra_tokens), args.pool_size,
                   f'--tokens {n}')


def methods(args) -> Dict[str, dict]:
    """Method name -> mita_attention keywords (None: SDPA)."""
    out = {f'mita_{b}': dict(backend=b) for b in args.backends}
    out['sdpa'] = None
    if args.experts_per_query > 1:
        out[f'mita_s{args.experts_per_query}'] = dict(
            backend=args.backends[0],
            experts_per_query=args.experts_per_query)
    return out


def _calls(q, k, v, grad, hw, args) -> Dict[tuple, Callable]:
    def attend(options):
        if options is None:
            return lambda: F.scaled_dot_product_attention(q, k, v)
        return lambda: mita_attention(
            q, k, v, hw, num_extra_tokens=args.extra_tokens,
            pool_size=args.pool_size, topk=args.topk, **options)

    def forward(call):
        def run():
            with torch.no_grad():
                return call()
        return run

    def forward_backward(call):
        def run():
            for t in (q, k, v):
                t.grad = None
            call().backward(grad)
        return run

    calls = {}
    for method, options in methods(args).items():
        call = attend(options)
        calls[(method, 'forward')] = forward(call)
        calls[(method, 'forward_backward')] = forward_backward(call)
    return calls


def measure_tokens(n: int, args, device) -> list:
    """The rows of one N: every method in both modes."""
    hw = patch_grid(n, args.extra_tokens)
    heads = (1 if args.single_head_from and n >= args.single_head_from else
             args.heads)
    gen = torch.Generator().manual_seed(args.seed)
    shape = (args.batch, heads, n, args.head_dim)
    q, k, v, grad = (torch.randn(shape, generator=gen).to(
        device, getattr(torch, args.dtype)) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    calls = _calls(q, k, v, grad, hw, args)
    memory, slow = {}, {}
    for key, call in calls.items():  # the warm-up
        seconds = []
        memory[key] = peak_memory(
            lambda: seconds.append(run_timed(call, device)), device)
        if seconds[0] >= args.time_budget:
            slow[str(key)] = seconds
    load_before = load_average()
    times = time_interleaved({str(key): c for key, c in calls.items()},
                             device, args.repeats, args.time_budget, slow)
    rows = []
    for (method, mode) in calls:
        rows.append(dict(
            tokens=n, grid=list(hw), batch=args.batch, heads=heads,
            head_dim=args.head_dim, m=args.pool_size**2, k=args.topk,
            method=method, mode=mode, **summarize(times[str((method, mode))]),
            peak_bytes=memory[(method, mode)],
            timed_by_memory_run=str((method, mode)) in slow,
            load_average=[load_before, load_average()]))
    _add_ratios(rows, args)
    return rows


def _add_ratios(rows, args) -> None:
    """``speedup_vs_sdpa``; for MiTA with several experts per query its
    time over one expert's (``time_vs_one_expert``) and ``keys_ratio``."""
    best = {(r['method'], r['mode']): r['best_s'] for r in rows}
    first = f'mita_{args.backends[0]}'
    s = args.experts_per_query
    for r in rows:
        r['speedup_vs_sdpa'] = best[('sdpa', r['mode'])] / r['best_s']
        if r['method'] == f'mita_s{s}':
            topk = min(args.topk, r['tokens'])
            r['keys_ratio'] = (r['m'] + s * topk) / (r['m'] + topk)
            r['time_vs_one_expert'] = r['best_s'] / best[(first, r['mode'])]


def run(args: argparse.Namespace) -> int:
    _check(args)
    device = torch.device(args.device)
    doc = document(args, device)
    for n in args.tokens:
        doc['rows'] += measure_tokens(n, args, device)
        save(doc, args)
        print(f'N={n} done', file=sys.stderr, flush=True)
    finish(doc, args, table, plot)
    return 0


def _ms(row) -> str:
    return (f'{row["best_s"] * 1e3:.2f}' +
            ('*' if row['timed_by_memory_run'] else ''))


COLUMNS = [
    Column('N', 'tokens'),
    Column('B x H', lambda r: r['batch'] * r['heads']),
    Column('method', 'method', left=True),
    Column('mode', 'mode', left=True),
    Column('ms', lambda r: r, _ms),
    fixed('x SDPA', 'speedup_vs_sdpa'),
    Column('peak MiB', 'peak_bytes', lambda v: f'{v / 2**20:.1f}'),
    fixed('vs 1 expert', 'time_vs_one_expert'),
    fixed('keys ratio', 'keys_ratio'),
]


table = Table(COLUMNS, notes=[
    'x SDPA = SDPA time / method time, same mode (best of the repeats); '
    'peak = bytes allocated above the inputs; * = one run, the memory run; '
    'vs 1 expert = time / the time with one routed expert; keys ratio = '
    '(m + s k) / (m + k)'
])


def plot(doc: dict, path: str) -> None:
    """Log-log time and peak memory per (batch x head) against N."""
    rows = doc['rows']
    series = list(dict.fromkeys((r['method'], r['mode']) for r in rows))
    panels = []
    for key, unit, scale in (('best_s', 'seconds', 1.0),
                             ('peak_bytes', 'peak MiB', 2**-20)):
        curves = []
        for method, mode in series:
            mine = [r for r in rows if (r['method'], r['mode']) == (method,
                                                                    mode)]
            curves.append(Curve(
                f'{method} {mode.replace("_", "+")}',
                [r['tokens'] for r in mine],
                [r[key] * scale / (r['batch'] * r['heads']) for r in mine],
                'o-' if mode == 'forward_backward' else 's--'))
        panels.append(Panel(f'{unit} per (batch x head)', 'tokens N', unit,
                            curves))
    plot_panels(path, panels, columns=2)
