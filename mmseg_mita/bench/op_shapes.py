"""MiTA op forward+backward at the configs' shapes, eager and graph-captured.

A shape ``N:BH`` (``--shapes``) is N tokens (``--extra-tokens`` cls
tokens and the most square patch grid: 32 x 32 at 1025, 64 x 128 at 8193)
and BH = batch x heads (6 heads per image when 6 divides BH, else BH
heads): 1025:12 is ViT-S at 512 x 512 with 2 images, 1025:96 with 16,
4097:12 at 1024 x 1024 with 2, 8193:6 at 1024 x 2048 with 1, 65537:1 one
head at 4096 x 4096; head_dim 64, m = k = 49 by default.

Every method (``sdpa``, ``mita_<backend>`` for each of ``--backends``)
runs in each of ``--modes``: ``eager`` (always: the others are checked
against it), ``compiled`` (``torch.compile(mode=--compile-mode)`` of the
attention call; dynamo's graph breaks counted) and ``cudagraph`` (the
whole forward+backward recorded in one ``torch.cuda.CUDAGraph`` and
replayed; CUDA only, and not for a call that reads device values on the
host). A mode that fails is recorded with its error. A graph mode is
checked against eager on fresh
inputs (``rel_err_vs_eager``: the largest relative error of the output
and the three gradients). Times are per call: a timed run repeats the step
for ``--min-run-ms`` (launch-bound calls), runs of all methods and modes
interleaved, best of ``--repeats``; ``speedup_vs_sdpa`` = SDPA time /
method time in the same mode (SDPA eager where SDPA failed in it). The
JSON is rewritten after every shape.
"""
import argparse
import functools
import math
import sys
import time

import torch
import torch.nn.functional as F

from mmseg_mita.ops import mita_attention
from .cli import LOW_PRECISION, gpu_defaults
from .graphs import (add_compile_options, capture_cuda_graph, compiled,
                     forward_backward, graph_breaks, mark_step,
                     relative_error, reset_compiler, results)
from .measure import peak_memory, run_timed, summarize, time_interleaved
from .record import document, finish, save
from .report import Column, Table, fixed, milliseconds
from .workloads import (OP_SHAPES, batch_heads, check_grid, op_shape,
                        patch_grid, positive_int)

COMMON = gpu_defaults(repeats=10, time_budget=2.0)
DTYPES = LOW_PRECISION
MODES = ('eager', 'compiled', 'cudagraph')


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--shapes', type=op_shape, nargs='+',
                        default=[op_shape(s) for s in OP_SHAPES],
                        metavar='N:BH', help=f'default: {" ".join(OP_SHAPES)}')
    parser.add_argument('--backends', nargs='+', default=['torch', 'triton'])
    parser.add_argument('--modes', nargs='+', default=list(MODES),
                        choices=MODES, help='eager is measured in any case')
    add_compile_options(parser)
    parser.add_argument('--heads', type=positive_int, default=6)
    parser.add_argument('--head-dim', type=positive_int, default=64)
    parser.add_argument('--extra-tokens', type=int, default=1)
    parser.add_argument('--pool-size', type=positive_int, default=7)
    parser.add_argument('--topk', type=positive_int, default=49)
    parser.add_argument('--max-seconds', type=float, default=0,
                        help='start no shape after this many seconds (0: '
                        'no limit)')
    parser.add_argument('--min-run-ms', type=float, default=20.0,
                        help='repeat the step within one timed run until '
                        'it lasts this long')


def attends(args, hw) -> dict:
    """Method name -> attend(q, k, v)."""
    out = {'sdpa': F.scaled_dot_product_attention}
    for backend in args.backends:
        out[f'mita_{backend}'] = functools.partial(
            mita_attention, hw=hw, num_extra_tokens=args.extra_tokens,
            pool_size=args.pool_size, topk=args.topk, backend=backend)
    return out


def prepare(mode: str, attend, inputs, grad, args, device):
    """A warmed-up ``run()`` of one forward+backward in ``mode`` returning
    the output (its gradients are in ``inputs[i].grad``), and notes."""
    if mode == 'eager':
        run = forward_backward(attend, inputs, grad)
        run()
        return run, {}
    if mode == 'compiled':
        before = graph_breaks()
        run = forward_backward(
            compiled(attend, args.compile_mode, args.compile_backend),
            inputs, grad, before=mark_step)
        start = time.perf_counter()
        for _ in range(3):  # compile, then CUDA-graph trees record
            run()
        return run, dict(warmup_s=time.perf_counter() - start,
                         graph_breaks=graph_breaks() - before)
    if device.type != 'cuda':
        raise RuntimeError('CUDA graphs need a CUDA device')
    graph, out = capture_cuda_graph(forward_backward(attend, inputs, grad))

    def replay():
        graph.replay()
        return out
    return replay, {}


def check_against_eager(run, eager, inputs) -> float:
    """Relative error of ``run`` to eager on fresh input values."""
    with torch.no_grad():
        for t in inputs:
            t.copy_(torch.randn_like(t))
    got = results(run(), inputs)
    return relative_error(got, results(eager(), inputs))


def _repeat(run, times: int) -> None:
    for _ in range(times):
        run()


def measure_shape(n: int, bh: int, args, device) -> list:
    """The rows of one shape: every method in every mode."""
    reset_compiler()
    hw = patch_grid(n, args.extra_tokens)
    batch, heads = batch_heads(bh, args.heads)
    gen = torch.Generator().manual_seed(args.seed)
    shape = (batch, heads, n, args.head_dim)
    q, k, v, grad = (torch.randn(shape, generator=gen).to(
        device, getattr(torch, args.dtype)) for _ in range(4))
    inputs = (q, k, v)
    for t in inputs:
        t.requires_grad_()
    rows, runs = {}, {}
    for method, attend in attends(args, hw).items():
        eager = None
        for mode in ['eager'] + [m for m in args.modes if m != 'eager']:
            row = rows[(method, mode)] = dict(
                tokens=n, bh=bh, batch=batch, heads=heads, grid=list(hw),
                head_dim=args.head_dim, m=args.pool_size**2, k=args.topk,
                method=method, mode=mode)
            try:
                run, notes = prepare(mode, attend, inputs, grad, args,
                                     device)
                row.update(notes)
                if mode == 'eager':
                    eager = run
                elif eager is not None:
                    row['rel_err_vs_eager'] = check_against_eager(
                        run, eager, inputs)
                runs[(method, mode)] = run
            except Exception as error:  # recorded; the others still run
                row['error'] = f'{type(error).__name__}: {error}'[:2000]
                if device.type == 'cuda':
                    torch.cuda.empty_cache()
    loops, iters = {}, {}
    for key, run in runs.items():
        once = run_timed(run, device)
        iters[key] = max(1, min(1000, math.ceil(
            args.min_run_ms / 1e3 / max(once, 1e-9))))
        loops[str(key)] = functools.partial(_repeat, run, iters[key])
    times = time_interleaved(loops, device, args.repeats, args.time_budget)
    for key, run in runs.items():
        rows[key].update(summarize([t / iters[key]
                                    for t in times[str(key)]]),
                         iters=iters[key], peak_bytes=peak_memory(run,
                                                                  device))
    for (method, mode), row in rows.items():
        base = rows[('sdpa', mode)]
        if 'best_s' not in base:
            base = rows[('sdpa', 'eager')]
        if 'best_s' in row and 'best_s' in base:
            row['speedup_vs_sdpa'] = base['best_s'] / row['best_s']
    return list(rows.values())


def run(args: argparse.Namespace) -> int:
    for n, _ in args.shapes:
        check_grid(patch_grid(n, args.extra_tokens), args.pool_size,
                   f'--shapes {n}')
    device = torch.device(args.device)
    doc = document(args, device)
    start = time.perf_counter()
    for n, bh in args.shapes:
        if args.max_seconds and time.perf_counter() - start > args.max_seconds:
            doc.setdefault('skipped', []).append(f'{n}:{bh}')
            continue
        doc['rows'] += measure_shape(n, bh, args, device)
        doc['seconds'] = time.perf_counter() - start
        save(doc, args)
        print(f'N={n} BH={bh} done', file=sys.stderr, flush=True)
    finish(doc, args, table)
    return 0


def _notes(row) -> str:
    if 'error' in row:
        return 'failed: ' + row['error'][:80]
    notes = []
    if 'graph_breaks' in row:
        notes.append(f'{row["graph_breaks"]} graph breaks')
    if 'rel_err_vs_eager' in row:
        notes.append(f'rel err vs eager {row["rel_err_vs_eager"]:.1e}')
    return ', '.join(notes)


COLUMNS = [
    Column('N', 'tokens'),
    Column('B x H', 'bh'),
    Column('method', 'method', left=True),
    Column('mode', 'mode', left=True),
    milliseconds('fwd+bwd ms', 3),
    fixed('x SDPA', 'speedup_vs_sdpa'),
    Column('peak MiB', 'peak_bytes', lambda v: f'{v / 2**20:.1f}'),
    Column('notes', _notes, left=True),
]


table = Table(COLUMNS, notes=[
    'x SDPA = SDPA time / method time in the same mode (best run, per '
    'call); peak = bytes allocated above the inputs (graph modes: not what '
    'the capture allocated)'
])
