"""Launches per call of MiTA attention: ATen ops, Triton kernels, host syncs.

Per stage (forward, then the backward of one upstream gradient), counted
as :mod:`mmseg_mita.bench.launch_counter` says: ATen ops that launch work
(views, allocations and metadata ops left out; the inner ops of a
``torch.library.custom_op`` included), Triton launches and host syncs,
after one uncounted warm-up call on a GPU (compiling, autotuning); with
``--device cuda`` also the CUDA kernels from ``torch.profiler``. Every N
is one cls token and the most square patch grid. On CPU the Triton backend
runs under ``TRITON_INTERPRET=1`` (set here before triton is imported;
slow at large N).
"""
import argparse
import os
import sys

import torch

from mmseg_mita.ops import mita_attention
from .launch_counter import count_launches
from .record import document, finish
from .report import Column, Table
from .workloads import patch_grid, positive_int

COMMON = dict(device='cpu', dtype='bfloat16', threads=0, seed=0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--backends', nargs='+', default=['torch', 'triton'])
    parser.add_argument('--tokens', type=positive_int, nargs='+',
                        default=[1025, 4097], help='N = 1 (cls) + H * W')
    for name, default in (('heads', 6), ('batch', 1), ('head-dim', 64),
                          ('pool-size', 7), ('topk', 49)):
        parser.add_argument(f'--{name}', type=positive_int, default=default)


def count(args, backend: str, tokens: int, device) -> dict:
    hw = patch_grid(tokens)
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(args.seed)
    shape = (args.batch, args.heads, tokens, args.head_dim)
    inputs = [torch.randn(shape, generator=gen).to(device, dtype)
              .requires_grad_() for _ in range(3)]
    grad = torch.randn(shape, generator=gen).to(device, dtype)

    def call(q, k, v):
        return mita_attention(q, k, v, hw, pool_size=args.pool_size,
                              topk=args.topk, backend=backend)

    # Without a GPU nothing is compiled or autotuned: no warm-up needed.
    stages = count_launches(call, inputs, grad, warmup=device.type != 'cpu')
    row = dict(backend=backend, tokens=tokens, hw=list(hw))
    for stage, counts in stages.items():
        row[stage] = counts.as_dict()
    return row


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    if device.type != 'cuda':
        os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton
    doc = document(args, device)
    for backend in args.backends:
        for tokens in args.tokens:
            doc['rows'].append(count(args, backend, tokens, device))
            print(f'counted {backend} N={tokens}', file=sys.stderr)
    finish(doc, args, table)
    return 0


def _both(key):
    return lambda r: f'{r["forward"][key]} + {r["backward"][key]}'


def _launches(stages):
    def cell(r):
        aten = sum(r[s]['aten'] for s in stages)
        triton = sum(r[s]['triton'] for s in stages)
        return f'{aten + triton} ({aten} + {triton})'
    return cell


COLUMNS = [
    Column('backend', 'backend', left=True),
    Column('N', 'tokens'),
    Column('forward launches (ATen + Triton)', _launches(['forward'])),
    Column('forward+backward launches (ATen + Triton)',
           _launches(['forward', 'backward'])),
    Column('host syncs (fwd + bwd)', _both('host_syncs')),
    Column('CUDA kernels (fwd + bwd)',
           lambda r: None if r['forward']['cuda_kernels'] is None else
           _both('cuda_kernels')(r)),
]
table = Table(COLUMNS)
