"""Command-line options shared by the benchmark tools."""
import argparse
import json
import sys
from typing import Dict, Tuple

import torch

from .measure import machine_info

DTYPES = dict(float32=torch.float32, float16=torch.float16,
              bfloat16=torch.bfloat16, float64=torch.float64)


def add_measuring_options(parser: argparse.ArgumentParser, *,
                          repeats: int = None, time_budget: float = None,
                          device: str = 'cpu', dtype: str = None,
                          dtypes=tuple(DTYPES)) -> None:
    """``--device``, ``--dtype`` (when given a default; one of ``dtypes``),
    ``--repeats`` and ``--time-budget`` (when given a default; tools that
    time), ``--threads``, ``--seed`` and ``--json``, with this tool's
    defaults; :func:`measuring_device` applies them."""
    parser.add_argument('--device', default=device)
    if dtype is not None:
        parser.add_argument('--dtype', default=dtype, choices=list(dtypes))
    if repeats is not None:
        parser.add_argument('--repeats', type=int, default=repeats,
                            help='timed runs per measurement')
    if time_budget is not None:
        parser.add_argument(
            '--time-budget', type=float, default=time_budget,
            help='stop repeating a measurement once its runs add up to '
            'this many seconds (one run at least)')
    parser.add_argument('--threads', type=int, default=0,
                        help='torch CPU threads (0: torch default)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--json', metavar='PATH',
                        help="write the results as JSON ('-': stdout)")


def measuring_device(args: argparse.Namespace) -> torch.device:
    """Applies ``--threads`` and returns the ``--device``."""
    if args.threads:
        torch.set_num_threads(args.threads)
    return torch.device(args.device)


def add_deadline_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--max-seconds``: start no ``what`` once that many seconds are
    spent (0: no limit), so that a run under an outer time limit ends by
    itself with what it measured."""
    parser.add_argument('--max-seconds', type=float, default=0,
                        help=f'start no {what} after this many seconds '
                        '(0: no limit)')


def start_measuring(args: argparse.Namespace
                    ) -> Tuple[torch.device, Dict[str, object]]:
    """:func:`measuring_device`, and the machine information (printed on
    stderr as JSON)."""
    device = measuring_device(args)
    info = machine_info(device)
    print(json.dumps(info), file=sys.stderr)
    return device, info
