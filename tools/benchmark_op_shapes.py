"""Forward+backward time of MiTA attention at the shapes of the configs,
eager and graph-captured, against full attention on the same inputs.

    python tools/benchmark_op_shapes.py [--device cuda] [--dtype bfloat16]
        [--shapes 1025:12 1025:96 4097:12 8193:6 65537:1]
        [--backends torch triton] [--graph compile cudagraph]
        [--compile-mode reduce-overhead] [--json out.json]

A shape ``N:BH`` is N tokens (``--extra-tokens`` cls tokens and a patch
grid H x W, H the largest divisor of N - extra not above its square root:
32 x 32 at 1025, 64 x 128 at 8193) and BH = batch x heads (batch BH / 6 of
6 heads when 6 divides BH, else BH heads): 1025:12 is ViT-S at 512 x 512
with 2 images, 1025:96 with 16, 4097:12 at 1024 x 1024 with 2, 8193:6 at
1024 x 2048 with 1, 65537:1 one head at 4096 x 4096. head_dim 64, m =
``--pool-size`` ^ 2 = 49, k = ``--topk`` = 49.

Every method (``sdpa``, ``mita_<backend>`` for each of ``--backends``)
runs in each mode: ``eager``; ``compile``: ``torch.compile(mode=
--compile-mode)`` of the attention call (reduce-overhead records CUDA
graphs of what it compiles; dynamo's graph breaks are counted); and
``cudagraph``: the whole forward+backward recorded in one
``torch.cuda.CUDAGraph`` and replayed (CUDA only; fails for a call that
reads device values on the host, e.g. MiTA's torch backend). A mode that
fails is recorded with its error; the others still run. A graph-captured
mode is checked against eager on fresh inputs (``rel_err_vs_eager``: the
largest relative error of the output and the three gradients).

Times are per call: each timed run repeats the step enough times to last
``--min-run-ms``, runs of all methods and modes are interleaved (same
machine load), best of ``--repeats``. ``speedup_vs_sdpa`` = SDPA time /
method time in the same mode (SDPA eager if SDPA failed in that mode). The
JSON is rewritten after every shape, so a run cut short keeps what it
measured.
"""
import argparse
import functools
import math
import sys
import time

import torch
import torch.nn.functional as F

from mmseg_mita.benchmarks import (DTYPES, add_deadline_option,
                                   add_measuring_options, peak_memory,
                                   run_timed, start_measuring, summarize,
                                   time_interleaved)
from mmseg_mita.benchmarks.graphs import (add_compile_options,
                                          capture_cuda_graph, compiled,
                                          forward_backward, graph_breaks,
                                          mark_step, relative_error,
                                          reset_compiler, results)
from mmseg_mita.ops import mita_attention
from mmseg_mita.utils import write_json

SHAPES = ('1025:12', '1025:96', '4097:12', '8193:6', '65537:1')
GRAPH_MODES = ('compile', 'cudagraph')


def parse_shape(value: str):
    try:
        n, bh = (int(x) for x in value.split(':'))
    except ValueError:
        n = bh = 0
    if n < 2 or bh < 1:
        raise argparse.ArgumentTypeError(
            f'--shapes takes N:BH (tokens : batch x heads), e.g. 1025:12, '
            f'got {value!r}')
    return n, bh


def grid(tokens: int, extra_tokens: int):
    """(H, W): H the largest divisor of the patch count <= its root."""
    patches = tokens - extra_tokens
    if patches < 1:
        raise SystemExit(f'--shapes {tokens}: fewer tokens than the '
                         f'{extra_tokens} extra tokens')
    h = max(d for d in range(1, math.isqrt(patches) + 1) if patches % d == 0)
    return h, patches // h


def layout(bh: int, heads: int):
    """(batch, heads) of BH = batch x heads."""
    heads = heads if bh % heads == 0 else bh
    return bh // heads, heads


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='MiTA op at config shapes, eager and graph-captured')
    parser.add_argument('--shapes', type=parse_shape, nargs='+',
                        default=[parse_shape(s) for s in SHAPES],
                        metavar='N:BH')
    parser.add_argument('--backends', nargs='+', default=['torch', 'triton'])
    parser.add_argument('--graph', nargs='*', default=list(GRAPH_MODES),
                        choices=GRAPH_MODES,
                        help='graph-captured modes measured besides eager')
    add_compile_options(parser)
    parser.add_argument('--heads', type=int, default=6)
    parser.add_argument('--head-dim', type=int, default=64)
    parser.add_argument('--extra-tokens', type=int, default=1)
    parser.add_argument('--pool-size', type=int, default=7)
    parser.add_argument('--topk', type=int, default=49)
    add_deadline_option(parser, 'shape')
    parser.add_argument('--min-run-ms', type=float, default=20.0,
                        help='repeat the step within one timed run until '
                        'it lasts this long (launch-bound calls)')
    add_measuring_options(parser, repeats=10, time_budget=2.0,
                          device='cuda', dtype='bfloat16',
                          dtypes=('float32', 'float16', 'bfloat16'))
    args = parser.parse_args(argv)
    for name in ('heads', 'head_dim', 'pool_size', 'topk', 'repeats'):
        if getattr(args, name) < 1:
            parser.error(f'--{name.replace("_", "-")} must be >= 1')
    for n, _ in args.shapes:
        h, w = grid(n, args.extra_tokens)
        if min(h, w) < args.pool_size:
            parser.error(f'--shapes {n}: grid {h} x {w} is smaller than '
                         f'--pool-size {args.pool_size}')
    return args


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
    notes = {}
    if mode == 'eager':
        run = forward_backward(attend, inputs, grad)
        run()
        return run, notes
    if mode == 'compile':
        before = graph_breaks()
        run = forward_backward(
            compiled(attend, args.compile_mode, args.compile_backend),
            inputs, grad, before=mark_step)
        start = time.perf_counter()
        for _ in range(3):  # compile, then CUDA-graph trees record
            run()
        notes['warmup_s'] = time.perf_counter() - start
        notes['graph_breaks'] = graph_breaks() - before
        return run, notes
    if device.type != 'cuda':
        raise RuntimeError('CUDA graphs need a CUDA device')
    graph, out = capture_cuda_graph(forward_backward(attend, inputs, grad))

    def replay():
        graph.replay()
        return out
    return replay, notes


def check_against_eager(run, eager, inputs) -> float:
    """Relative error of ``run`` to eager on fresh input values."""
    with torch.no_grad():
        for t in inputs:
            t.copy_(torch.randn_like(t))
    got = results(run(), inputs)
    return relative_error(got, results(eager(), inputs))


def bench_shape(n: int, bh: int, args, device) -> dict:
    reset_compiler()
    hw = grid(n, args.extra_tokens)
    batch, heads = layout(bh, args.heads)
    gen = torch.Generator(device='cpu').manual_seed(args.seed)
    shape = (batch, heads, n, args.head_dim)
    q, k, v, grad = (torch.randn(shape, generator=gen).to(
        device, DTYPES[args.dtype]) for _ in range(4))
    inputs = (q, k, v)
    for t in inputs:
        t.requires_grad_()
    record = dict(tokens=n, bh=bh, batch=batch, heads=heads, grid=list(hw),
                  head_dim=args.head_dim, m=args.pool_size**2, k=args.topk,
                  methods={})
    runs = {}
    for method, attend in attends(args, hw).items():
        eager = None
        for mode in ['eager'] + list(args.graph):
            entry = record['methods'].setdefault(method, {})[mode] = {}
            try:
                run, notes = prepare(mode, attend, inputs, grad, args,
                                     device)
                entry.update(notes)
                if mode == 'eager':
                    eager = run
                elif eager is not None:
                    entry['rel_err_vs_eager'] = check_against_eager(
                        run, eager, inputs)
                runs[(method, mode)] = run
            except Exception as error:  # recorded; the others still run
                entry['error'] = f'{type(error).__name__}: {error}'[:2000]
                if device.type == 'cuda':
                    torch.cuda.empty_cache()

    # Launch-bound calls: repeat each step within a timed run.
    loops, iters = {}, {}
    for key, run in runs.items():
        once = run_timed(run, device)
        iters[key] = max(1, min(1000, math.ceil(
            args.min_run_ms / 1e3 / max(once, 1e-9))))
        loops[str(key)] = functools.partial(_repeat, run, iters[key])
    times = time_interleaved(loops, device, args.repeats, args.time_budget)
    for (method, mode), run in runs.items():
        entry = record['methods'][method][mode]
        entry.update(summarize([t / iters[(method, mode)]
                                for t in times[str((method, mode))]]))
        entry['iters'] = iters[(method, mode)]
        entry['peak_bytes'] = peak_memory(run, device)
    sdpa = record['methods']['sdpa']
    for method, modes in record['methods'].items():
        for mode, entry in modes.items():
            base = sdpa[mode] if 'best_s' in sdpa[mode] else sdpa['eager']
            if 'best_s' in entry and 'best_s' in base:
                entry['speedup_vs_sdpa'] = base['best_s'] / entry['best_s']
    return record


def _repeat(run, times: int) -> None:
    for _ in range(times):
        run()


def format_table(records) -> str:
    lines = [f'{"N":>6} {"BxH":>4} | {"method":<12} | {"mode":<9} | '
             f'{"fwd+bwd ms":>10} | {"x SDPA":>7} | {"peak MiB":>9} | notes']
    for r in records:
        for method, modes in r['methods'].items():
            for mode, e in modes.items():
                head = (f'{r["tokens"]:>6} {r["bh"]:>4} | {method:<12} | '
                        f'{mode:<9} |')
                if 'best_s' not in e:
                    lines.append(f'{head} failed: {e.get("error", "?")[:80]}')
                    continue
                notes = []
                if 'graph_breaks' in e:
                    notes.append(f'{e["graph_breaks"]} graph breaks')
                if 'rel_err_vs_eager' in e:
                    notes.append(f'rel err vs eager '
                                 f'{e["rel_err_vs_eager"]:.1e}')
                lines.append(
                    f'{head} {e["best_s"] * 1e3:>10.3f} | '
                    f'{e.get("speedup_vs_sdpa", float("nan")):>7.2f} | '
                    f'{e["peak_bytes"] / 2**20:>9.1f} | {", ".join(notes)}')
    lines.append('x SDPA = SDPA time / method time in the same mode (best '
                 'run, per call); peak = bytes allocated above the inputs '
                 '(graph modes: not what the capture allocated)')
    return '\n'.join(lines)


def main(argv=None):
    args = parse_args(argv)
    device, info = start_measuring(args)
    start = time.perf_counter()
    result = dict(machine=info, args=vars(args), results=[])
    for n, bh in args.shapes:
        if args.max_seconds and time.perf_counter() - start > args.max_seconds:
            result.setdefault('skipped', []).append(f'{n}:{bh}')
            continue
        result['results'].append(bench_shape(n, bh, args, device))
        result['seconds'] = time.perf_counter() - start
        if args.json:  # after every shape: a cut-short run keeps its data
            write_json(result, args.json)
        print(f'N={n} BH={bh} done', file=sys.stderr, flush=True)
    print(format_table(result['results']))
    return result


if __name__ == '__main__':
    main()
