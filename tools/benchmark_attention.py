"""Time and peak memory of MiTA attention against full attention.

    python tools/benchmark_attention.py [--tokens 1025 1601 4097 16385 65537]
        [--device cpu] [--dtype float32] [--heads 6] [--head-dim 64]
        [--backend auto | --backends torch triton ...]
        [--single-head-from 16385] [--pool-size 7] [--topk 49]
        [--experts-per-query 2] [--repeats 3] [--json results.json]
        [--plot scaling.png]

Every N is a square patch grid plus ``--extra-tokens`` (cls) tokens. For
each, on the same random q, k, v and in the same run, it measures the
forward (under ``torch.no_grad``) and forward+backward time and peak memory
of ``mita_attention`` (m = pool_size^2 landmarks, k = topk routed keys) and
of ``F.scaled_dot_product_attention``; ``--backends`` measures several
MiTA backends in the same run (methods ``mita_<backend>``, speed-ups
``speedup_<mode>_<backend>``; a single ``--backend`` keeps ``mita`` and
``speedup_<mode>``). Runs are interleaved so that all
see the same machine load; times are the best of the repeats (a shared
machine only ever adds time). Peak memory is what the call allocates above
its inputs (see ``mmseg_mita.benchmarks`` for how it is measured on CPU).
The memory run doubles as the warm-up, and is the only timing of a call
slower than ``--time-budget`` (marked ``*``). The PyTorch profiler used for
CPU memory prints ``USDT ... profiler_start`` lines on stderr.

``--experts-per-query S`` (S > 1) also measures MiTA with ``S`` routed
experts per query, in the same interleaved runs, and prints a second table:
its time relative to ``S = 1`` beside the ratio of keys per query,
``(m + S k) / (m + k)``.
"""
import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F

from mmseg_mita.benchmarks import (DTYPES, add_measuring_options, load_average,
                                   machine_info, measuring_device, peak_memory,
                                   run_timed, summarize, time_interleaved)
from mmseg_mita.ops import mita_attention
from mmseg_mita.utils import write_atomic, write_json

MODES = ('forward', 'forward_backward')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='MiTA attention vs full attention: time and memory')
    parser.add_argument('--tokens', type=int, nargs='+',
                        default=[1025, 1601, 4097, 16385, 65537],
                        help='sequence lengths N = extra tokens + H * H')
    parser.add_argument('--extra-tokens', type=int, default=1)
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--heads', type=int, default=6)
    parser.add_argument('--single-head-from', type=int, default=16385,
                        help='use one head from this N on (0: never)')
    parser.add_argument('--head-dim', type=int, default=64)
    parser.add_argument('--pool-size', type=int, default=7,
                        help='landmark grid side; m = pool_size ** 2')
    parser.add_argument('--topk', type=int, default=49)
    parser.add_argument('--experts-per-query', type=int, default=1,
                        help='also time MiTA with this many routed experts '
                        'per query, relative to one (at most pool_size ** 2)')
    parser.add_argument('--backend', default='auto',
                        help='mita_attention backend (auto, torch, flash, '
                        'triton)')
    parser.add_argument('--backends', nargs='+', metavar='BACKEND',
                        help='measure several MiTA backends in one run '
                        '(replaces --backend)')
    add_measuring_options(parser, repeats=3, time_budget=120.0,
                          dtype='float32')
    parser.add_argument('--plot', metavar='PNG',
                        help='write a log-log plot of time and memory vs N')
    args = parser.parse_args(argv)
    for name in ('repeats', 'batch', 'heads', 'head_dim', 'pool_size',
                 'topk', 'experts_per_query'):
        if getattr(args, name) < 1:
            parser.error(f'--{name.replace("_", "-")} must be >= 1')
    if args.experts_per_query > args.pool_size**2:
        parser.error('--experts-per-query must be at most the number of '
                     f'experts pool_size ** 2 = {args.pool_size**2}')
    if args.experts_per_query > 1 and args.backends:
        parser.error('--experts-per-query compares with one --backend, not '
                     '--backends')
    for n in args.tokens:
        grid_side(n, args.extra_tokens, args.pool_size)
    return args


def mita_methods(args) -> dict:
    """Method name -> MiTA backend: ``mita`` for one ``--backend``,
    ``mita_<backend>`` for each of ``--backends``."""
    if not args.backends:
        return {'mita': args.backend}
    return {f'mita_{backend}': backend for backend in args.backends}


def methods(args) -> list:
    """The measured methods: MiTA per backend, SDPA and, with
    ``--experts-per-query`` above 1, MiTA with that many experts
    (``mita_multi``, on ``--backend``)."""
    multi = ['mita_multi'] if args.experts_per_query > 1 else []
    return list(mita_methods(args)) + ['sdpa'] + multi


def grid_side(tokens: int, extra_tokens: int, pool_size: int) -> int:
    """Side of the square patch grid of ``tokens`` tokens."""
    side = math.isqrt(max(tokens - extra_tokens, 0))
    if side * side != tokens - extra_tokens or side < pool_size:
        raise SystemExit(
            f'--tokens {tokens}: N - extra tokens ({extra_tokens}) must be a '
            f'square grid H * H with H >= pool size {pool_size}, e.g. '
            f'{extra_tokens + max(side, pool_size)**2}')
    return side


def _functions(q, k, v, grad, side, args):
    """The measured calls; backward runs start from fresh grads."""
    kwargs = dict(num_extra_tokens=args.extra_tokens,
                  pool_size=args.pool_size, topk=args.topk)

    def mita(backend):
        return lambda: mita_attention(q, k, v, (side, side), backend=backend,
                                      **kwargs)

    def mita_multi():
        return mita_attention(q, k, v, (side, side),
                              experts_per_query=args.experts_per_query,
                              **kwargs)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v)

    def forward(attend):
        def run():
            with torch.no_grad():
                return attend()
        return run

    def forward_backward(attend):
        def run():
            for t in (q, k, v):
                t.grad = None
            attend().backward(grad)
        return run

    attends = [(name, mita(backend))
               for name, backend in mita_methods(args).items()]
    attends.append(('sdpa', sdpa))
    if args.experts_per_query > 1:
        attends.append(('mita_multi', mita_multi))
    calls = {}
    for method, attend in attends:
        calls[(method, 'forward')] = forward(attend)
        calls[(method, 'forward_backward')] = forward_backward(attend)
    return calls


def bench_tokens(n: int, args, device: torch.device) -> dict:
    side = grid_side(n, args.extra_tokens, args.pool_size)
    heads = (1 if args.single_head_from and n >= args.single_head_from else
             args.heads)
    gen = torch.Generator(device='cpu').manual_seed(args.seed)
    shape = (args.batch, heads, n, args.head_dim)
    q, k, v, grad = (torch.randn(shape, generator=gen).to(
        device, DTYPES[args.dtype]) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    calls = _functions(q, k, v, grad, side, args)

    # The memory run is the warm-up; a call slower than the time budget
    # (full attention at large N) is timed by it instead of run again.
    memory, slow = {}, {}
    for key, call in calls.items():
        seconds = []
        memory[key] = peak_memory(
            lambda: seconds.append(run_timed(call, device)), device)
        if seconds[0] >= args.time_budget:
            slow[str(key)] = seconds
    for t in (q, k, v):
        t.grad = None
    load_before = load_average()
    times = time_interleaved({str(key): call for key, call in calls.items()},
                             device, args.repeats, args.time_budget, slow)
    record = dict(tokens=n, grid=[side, side], batch=args.batch, heads=heads,
                  methods=methods(args),
                  head_dim=args.head_dim, landmarks=args.pool_size**2,
                  topk=args.topk, load_average=[load_before, load_average()])
    for method in methods(args):
        record[method] = {
            mode: dict(summarize(times[str((method, mode))]),
                       peak_bytes=memory[(method, mode)],
                       timed_by_memory_run=str((method, mode)) in slow)
            for mode in MODES
        }
    for method in mita_methods(args):
        for mode in MODES:
            record[f'speedup_{mode}{method[4:]}'] = (
                record['sdpa'][mode]['best_s'] /
                record[method][mode]['best_s'])
    if args.experts_per_query > 1:
        m, topk = args.pool_size**2, min(args.topk, n)
        record['experts_per_query'] = args.experts_per_query
        record['keys_ratio'] = (m + args.experts_per_query * topk) / (m + topk)
        for mode in MODES:
            record[f'multi_time_ratio_{mode}'] = (
                record['mita_multi'][mode]['best_s'] /
                record['mita'][mode]['best_s'])
    return record


def _ms(stats: dict) -> str:
    mark = '*' if stats['timed_by_memory_run'] else ' '
    return f'{stats["best_s"] * 1e3:.1f}{mark}'


def _label(method: str) -> str:
    if method == 'sdpa':
        return 'SDPA'
    return 'MiTA' if method == 'mita' else f'MiTA ({method[5:]})'


def format_table(records) -> str:
    """One row per (N, method); x = SDPA time / the method's time."""
    mib = 2**20
    lines = [
        f'{"N":>6} {"BxH":>4} | {"method":<14} | {"fwd ms":>9} {"x":>6} | '
        f'{"fwd+bwd ms":>10} {"x":>6} | {"fwd+bwd peak MiB":>16}'
    ]
    for r in records:
        for method in r['methods']:
            stats, sdpa = r[method], r['sdpa']
            speedups = [sdpa[mode]['best_s'] / stats[mode]['best_s']
                        for mode in MODES]
            lines.append(
                f'{r["tokens"]:>6} {r["batch"] * r["heads"]:>4} | '
                f'{_label(method):<14} | {_ms(stats["forward"]):>9} '
                f'{speedups[0]:>6.1f} | '
                f'{_ms(stats["forward_backward"]):>10} {speedups[1]:>6.1f} | '
                f'{stats["forward_backward"]["peak_bytes"] / mib:>16.1f}')
    lines.append('x = SDPA time / method time (best of the repeats); peak = '
                 'bytes allocated above the inputs; * = one run, the '
                 'memory run')
    return '\n'.join(lines)


def format_multi_table(records) -> str:
    """MiTA with ``s`` experts per query against ``s = 1``."""
    s = records[0]['experts_per_query']
    mib = 2**20
    lines = [
        f'{"N":>6} {"BxH":>4} | {"forward ms":^26} | {"fwd+bwd ms":^26} | '
        f'{"keys":>6} | {"fwd+bwd peak MiB":^19}',
        f'{"":>6} {"":>4} | {"s=1":>9} {f"s={s}":>9} {"ratio":>6} | '
        f'{"s=1":>9} {f"s={s}":>9} {"ratio":>6} | {"ratio":>6} | '
        f'{"s=1":>9} {f"s={s}":>9}'
    ]
    for r in records:
        row = f'{r["tokens"]:>6} {r["batch"] * r["heads"]:>4} |'
        for mode in MODES:
            row += (f' {_ms(r["mita"][mode]):>9} '
                    f'{_ms(r["mita_multi"][mode]):>9} '
                    f'{r[f"multi_time_ratio_{mode}"]:>6.2f} |')
        peaks = [r[method]['forward_backward']['peak_bytes'] / mib
                 for method in ('mita', 'mita_multi')]
        lines.append(row + f' {r["keys_ratio"]:>6.2f} | '
                     f'{peaks[0]:>9.1f} {peaks[1]:>9.1f}')
    lines.append(f'ratio = time with s={s} experts per query / time with '
                 f's=1 (best of the repeats); keys ratio = (m + {s} k) / '
                 '(m + k), the keys each query attends to')
    return '\n'.join(lines)


def plot(records, path: str) -> None:
    """Log-log time and peak memory per (batch x head) against N."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    tokens = [r['tokens'] for r in records]
    per = [r['batch'] * r['heads'] for r in records]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.5))
    for method in records[0]['methods']:
        label = _label(method).replace('SDPA', 'SDPA (full)')
        for mode, style in (('forward_backward', '-o'), ('forward', '--s')):
            ax_t.plot(tokens, [
                r[method][mode]['best_s'] / p for r, p in zip(records, per)
            ], style, label=f'{label} {mode.replace("_", "+")}')
            ax_m.plot(tokens, [
                r[method][mode]['peak_bytes'] / 2**20 / p
                for r, p in zip(records, per)
            ], style, label=f'{label} {mode.replace("_", "+")}')
    for ax, ylabel in ((ax_t, 'seconds per (batch x head)'),
                       (ax_m, 'peak MiB per (batch x head)')):
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('tokens N')
        ax.set_ylabel(ylabel)
        ax.grid(True, which='both', alpha=0.3)
        ax.legend(fontsize=8)
    ax_t.set_title('time')
    ax_m.set_title('peak memory')
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=120))
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    device = measuring_device(args)
    info = machine_info(device)
    print(json.dumps(info), file=sys.stderr)
    records = []
    for n in args.tokens:
        records.append(bench_tokens(n, args, device))
        speedups = ', '.join(
            f'{_label(method)} '
            f'{records[-1]["speedup_forward_backward" + method[4:]]:.2f}x'
            for method in mita_methods(args))
        print(f'N={n} done: fwd+bwd speed-up {speedups}', file=sys.stderr,
              flush=True)
    print(format_table(records))
    if args.experts_per_query > 1:
        print(format_multi_table(records))
    result = dict(machine=info, args=vars(args), results=records)
    if args.json:
        write_json(result, args.json)
    if args.plot:
        plot(records, args.plot)
    return result


if __name__ == '__main__':
    main()
