"""The command line of ``python -m mmseg_mita.bench SUBCOMMAND [options]``.

:data:`SUBCOMMANDS` maps each subcommand to its module in this package. A
module holds a docstring whose first paragraph, one sentence, is its help
(read from the source without importing the module),
``add_arguments(parser)``, ``run(args) -> int`` (the exit status) and,
optionally, ``COMMON``: the options of :func:`add_common` it takes, with
its defaults (``DTYPES``: the ``--dtype`` it accepts), and
``plot(document, path)`` (then it takes ``--plot``). ``--json`` and
``--markdown`` are everyone's. A module is imported only when its
subcommand runs: ``--help`` and the operator's subcommands never import
mmseg (the GPU machine has none).
"""
import argparse
import ast
import importlib
import os.path as osp
import sys
from typing import Optional, Sequence

PROG = 'python -m mmseg_mita.bench'
SUBCOMMANDS = {
    'op': 'op',
    'op-shapes': 'op_shapes',
    'encoder': 'encoder',
    'segmentor': 'segmentor',
    'scaling': 'scaling',
    'onnx': 'onnx_runtime',
    'throughput-1d': 'throughput_1d',
    'launches': 'launches',
    'kernels': 'kernels',
    'gpu': 'gpu',
}
DTYPES = ('float32', 'float16', 'bfloat16', 'float64')
# The --dtype of the subcommands that run on a GPU.
LOW_PRECISION = DTYPES[:3]


def gpu_defaults(repeats: int, time_budget: float) -> dict:
    """``COMMON`` of a subcommand of the GPU suite: CUDA, bfloat16."""
    return dict(device='cuda', dtype='bfloat16', repeats=repeats,
                time_budget=time_budget, threads=0, seed=0)


class UsageError(ValueError):
    """Options a subcommand cannot run with; the message names the option
    and the fix (reported like argparse's own errors, exit status 2)."""


def _path(name: str) -> str:
    return osp.join(osp.dirname(osp.abspath(__file__)),
                    SUBCOMMANDS[name] + '.py')


def summary(name: str) -> str:
    """The first sentence of a subcommand's module docstring (its first
    paragraph, on one line)."""
    path = _path(name)
    if not osp.isfile(path):
        return (f'(not in this installation: mmseg_mita/bench/'
                f'{SUBCOMMANDS[name]}.py)')
    with open(path) as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ''
    return ' '.join(doc.split('\n\n')[0].split())


def load(name: str):
    """The module of subcommand ``name`` (exits clearly if absent)."""
    if not osp.isfile(_path(name)):
        raise SystemExit(f'{PROG} {name}: {summary(name)}')
    return importlib.import_module(f'{__package__}.{SUBCOMMANDS[name]}')


def add_common(parser: argparse.ArgumentParser, module) -> None:
    """The options shared by the subcommands, those ``module.COMMON``
    names (with its defaults), and ``--json``, ``--markdown``, ``--plot``."""
    common = getattr(module, 'COMMON', {})
    if 'device' in common:
        parser.add_argument('--device', default=common['device'],
                            help='cpu, cuda or cuda:N (default: '
                            '%(default)s)')
    if 'dtype' in common:
        parser.add_argument('--dtype', default=common['dtype'],
                            choices=getattr(module, 'DTYPES', DTYPES))
    if 'repeats' in common:
        parser.add_argument('--repeats', type=_positive,
                            default=common['repeats'],
                            help='timed runs per measurement (default: '
                            '%(default)s)')
    if 'time_budget' in common:
        parser.add_argument(
            '--time-budget', type=float, default=common['time_budget'],
            help='stop repeating a measurement once its runs add up to '
            'this many seconds, one run at least (default: %(default)s)')
    if 'threads' in common:
        parser.add_argument('--threads', type=int, default=common['threads'],
                            help='torch CPU threads (0: torch default)')
    if 'seed' in common:
        parser.add_argument('--seed', type=int, default=common['seed'],
                            help='seed of the random inputs and weights')
    parser.add_argument('--json', metavar='PATH',
                        help="write the results as JSON ('-': stdout)")
    parser.add_argument('--markdown', metavar='PATH',
                        help='write the table as markdown')
    if hasattr(module, 'plot'):
        parser.add_argument('--plot', metavar='PNG',
                            help='write the plot as PNG (needs matplotlib)')


def _positive(text: str) -> int:
    from .workloads import positive_int
    return positive_int(text)


def _top_parser() -> argparse.ArgumentParser:
    width = max(len(name) for name in SUBCOMMANDS)
    listing = '\n'.join(f'  {name:<{width}}  {summary(name)}'
                        for name in SUBCOMMANDS)
    parser = argparse.ArgumentParser(
        prog=PROG, usage=f'{PROG} SUBCOMMAND [options]',
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description='Measure MiTA: time, memory and launches of the '
        'operator, the encoder and whole segmentors, against full '
        'attention in the same run; one JSON record format.',
        epilog=f'subcommands:\n{listing}\n\n'
        f'{PROG} SUBCOMMAND --help: the options of one')
    parser.add_argument('subcommand', choices=list(SUBCOMMANDS),
                        metavar='SUBCOMMAND')
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    if not argv or argv[0].startswith('-') or argv[0] not in SUBCOMMANDS:
        top.parse_args(argv[:1])  # help, or the error, and exit
    name = argv[0]
    module = load(name)
    parser = argparse.ArgumentParser(
        prog=f'{PROG} {name}', description=module.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(parser, module)
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    args.command = name
    if getattr(args, 'threads', 0):
        import torch
        torch.set_num_threads(args.threads)
    try:
        return module.run(args)
    except UsageError as error:
        parser.error(str(error))
