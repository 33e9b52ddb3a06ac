"""The one record format of ``python -m mmseg_mita.bench``.

Every subcommand writes (``--json PATH``) one JSON document::

    {"command": "op", "machine": {...}, "versions": {...},
     "settings": {...}, "rows": [{...}, ...], ...}

``machine``: what it ran on (CPU model, cores, load average, torch threads;
the GPU's name if there is one); ``versions``: Python and every
package of the stack that is installed (read from the installed
distributions, nothing is imported); ``settings``: the command line and
every option after parsing; ``rows``: the measurements, one flat dict
each, in the order they were taken. A subcommand may add keys of its own
(``seconds``, ``skipped``...). :func:`finish` prints the table and writes
the JSON, markdown and plot that were asked for.
"""
import argparse
import importlib.metadata
import os
import platform
import sys
from typing import Callable, Dict, Optional

import torch

from mmseg_mita.utils import write_json
from .measure import load_average
from .report import write_text

# Distributions named in ``versions`` when installed.
PACKAGES = ('mmseg_mita', 'torch', 'triton', 'numpy', 'mmcv', 'mmengine',
            'mmsegmentation', 'flash-attn', 'onnx', 'onnxruntime',
            'matplotlib')


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else its architecture."""
    try:
        with open('/proc/cpuinfo') as f:
            return next(line.split(':', 1)[1].strip() for line in f
                        if line.startswith('model name'))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine(device: Optional[torch.device] = None) -> Dict[str, object]:
    """What the numbers are measured on."""
    cores = (len(os.sched_getaffinity(0))
             if hasattr(os, 'sched_getaffinity') else os.cpu_count())
    info = dict(cpu=cpu_model(), cores=cores, load_average=load_average(),
                torch_threads=torch.get_num_threads())
    if torch.cuda.is_available():  # the GPU measured, else the first
        cuda = device is not None and device.type == 'cuda'
        info['gpu'] = torch.cuda.get_device_name(device if cuda else 0)
    return info


def device_name(device: torch.device) -> str:
    """The device as a table names it: the GPU's name, or the CPU's with
    the threads torch uses."""
    if device.type == 'cuda':
        return torch.cuda.get_device_name(device)
    return f'{cpu_model()}, {torch.get_num_threads()} threads'


def versions() -> Dict[str, str]:
    """Python's version and that of every installed package of
    :data:`PACKAGES`."""
    found = dict(python=platform.python_version())
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def settings(args: argparse.Namespace) -> Dict[str, object]:
    """The command line and the options (those JSON can hold)."""
    options = {
        key: value for key, value in vars(args).items()
        if isinstance(value, (str, int, float, bool, list, tuple, dict,
                              type(None)))
    }
    return dict(argv=list(sys.argv), **options)


def document(args: argparse.Namespace,
             device: Optional[torch.device] = None) -> dict:
    """A new document for ``args.command``, without rows yet."""
    return dict(command=args.command, machine=machine(device),
                versions=versions(), settings=settings(args), rows=[])


def save(doc: dict, args: argparse.Namespace) -> None:
    """Writes ``doc`` to ``--json`` if given (after every row, so that a
    run cut short keeps what it measured)."""
    if getattr(args, 'json', None):
        write_json(doc, args.json)


def finish(doc: dict, args: argparse.Namespace,
           table: Callable[[dict, bool], str],
           plot: Optional[Callable[[dict, str], None]] = None) -> None:
    """Prints ``table(doc, markdown=False)`` and writes what was asked:
    ``--json``, ``--markdown`` (``table(doc, markdown=True)``), ``--plot``
    (``plot(doc, path)``)."""
    print(table(doc, False))
    save(doc, args)
    if getattr(args, 'markdown', None):
        write_text(args.markdown, table(doc, True) + '\n')
    if plot is not None and getattr(args, 'plot', None):
        plot(doc, args.plot)
