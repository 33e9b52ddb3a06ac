"""Launches per call of MiTA attention: ATen ops, Triton kernels, host
syncs (and CUDA kernels on a GPU), per stage.

    python tools/count_launches.py [--backends torch triton]
        [--tokens 1025 4097] [--heads 6] [--batch 1] [--dtype bfloat16]
        [--device cpu] [--json launches.json]

Every N is one cls token plus an H x W patch grid (the most square one with
H * W = N - 1); head_dim 64, m = k = 49 (``--pool-size 7 --topk 49``).
Counted as ``mmseg_mita.benchmarks.launches`` says: ATen ops that launch
work (views, allocations and metadata ops left out; the inner ops of a
``torch.library.custom_op`` included), Triton launches, host syncs; after
one uncounted warm-up call on a GPU (compiling, autotuning). On CPU the
Triton backend runs under ``TRITON_INTERPRET=1`` (set here before triton is
imported; slow at large N). With ``--device cuda`` the CUDA kernels come
from ``torch.profiler``.
"""
import argparse
import math
import os
import sys


def parse_args(argv=None):
    from mmseg_mita.benchmarks.cli import add_measuring_options
    parser = argparse.ArgumentParser(
        description='MiTA attention: launches and host syncs per call')
    parser.add_argument('--backends', nargs='+', default=['torch', 'triton'])
    parser.add_argument('--tokens', type=int, nargs='+', default=[1025, 4097],
                        help='N = 1 (cls) + H * W')
    parser.add_argument('--heads', type=int, default=6)
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--head-dim', type=int, default=64)
    parser.add_argument('--pool-size', type=int, default=7)
    parser.add_argument('--topk', type=int, default=49)
    add_measuring_options(parser, dtype='bfloat16')
    return parser.parse_args(argv)


def grid(num_tokens: int):
    """The most square (H, W) with H * W = N - 1."""
    patches = num_tokens - 1
    h = max(d for d in range(1, math.isqrt(patches) + 1) if patches % d == 0)
    return h, patches // h


def count(args, backend: str, num_tokens: int, device) -> dict:
    import torch

    from mmseg_mita.benchmarks import DTYPES
    from mmseg_mita.benchmarks.launches import count_launches
    from mmseg_mita.ops import mita_attention
    hw = grid(num_tokens)
    gen = torch.Generator().manual_seed(args.seed)
    shape = (args.batch, args.heads, num_tokens, args.head_dim)
    inputs = [
        torch.randn(shape, generator=gen).to(device, DTYPES[args.dtype])
        .requires_grad_() for _ in range(3)
    ]
    grad = torch.randn(shape, generator=gen).to(device, DTYPES[args.dtype])

    def run(q, k, v):
        return mita_attention(q, k, v, hw, pool_size=args.pool_size,
                              topk=args.topk, backend=backend)

    # Without a GPU nothing is compiled or autotuned: no warm-up needed.
    stages = count_launches(run, inputs, grad, warmup=device.type != 'cpu')
    row = dict(backend=backend, tokens=num_tokens, hw=list(hw))
    for stage, counts in stages.items():
        row[stage] = counts.as_dict()
    return row


def table(rows) -> str:
    lines = ['| backend | N | forward launches (ATen + Triton) | '
             'forward+backward launches (ATen + Triton) | host syncs '
             '(fwd + bwd) | CUDA kernels (fwd + bwd) |',
             '|---|---|---|---|---|---|']
    for row in rows:
        fwd, bwd = row['forward'], row['backward']
        total = fwd['launches'] + bwd['launches']
        aten = fwd['aten'] + bwd['aten']
        triton = fwd['triton'] + bwd['triton']
        cuda = ('-' if fwd['cuda_kernels'] is None else
                f"{fwd['cuda_kernels']} + {bwd['cuda_kernels']}")
        lines.append(
            f"| {row['backend']} | {row['tokens']} | {fwd['launches']} "
            f"({fwd['aten']} + {fwd['triton']}) | {total} ({aten} + "
            f"{triton}) | {fwd['host_syncs']} + {bwd['host_syncs']} | "
            f'{cuda} |')
    return '\n'.join(lines)


def main(argv=None):
    args = parse_args(argv)
    if not args.device.startswith('cuda'):
        os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton
    from mmseg_mita.benchmarks import measuring_device
    from mmseg_mita.utils import write_json
    device = measuring_device(args)
    rows = []
    for backend in args.backends:
        for num_tokens in args.tokens:
            rows.append(count(args, backend, num_tokens, device))
            print(f'counted {backend} N={num_tokens}', file=sys.stderr)
    print(table(rows))
    if args.json:
        write_json(dict(settings=vars(args), results=rows), args.json)


if __name__ == '__main__':
    main()
