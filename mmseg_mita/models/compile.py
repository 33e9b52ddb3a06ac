"""``torch.compile`` of a segmentor's network, not of its training step.

:func:`compile_network` replaces the ``forward`` of each part of the model
(mmseg's ``backbone``, ``neck``, ``decode_head``, ``auxiliary_head``: every
child module but the data preprocessor; a ``ModuleList`` / ``ModuleDict``
of heads part by part) by ``torch.compile`` of it. The forward is
replaced on the instance, not the module's ``__call__``, because mmseg's
decode heads call ``self.forward(...)`` from ``loss`` and ``predict``.
Data samples, losses, the optimizer step and mmseg's sliding window stay
eager: dynamo sees tensors in, tensors out. It is what the config switch
``compile=True`` (or ``compile=dict(backend=..., mode=...)``) does through
:mod:`mmseg_mita.compat`, and what ``python -m mmseg_mita.bench
segmentor`` measures as ``compiled``.
"""
import inspect
from typing import Dict, List, Tuple

import torch
from torch import nn

# Children of a segmentor that are not the network.
NOT_NETWORK = ('data_preprocessor', )
# The oldest torch whose torch.compile gives the MiTA operator's gradients
# right (docs/install.md, "Minimum versions": zero on 2.11.0, no trace on
# 2.4.0 to 2.9.0).
COMPILE_MIN_TORCH = '2.13'


def compile_options(cfg) -> Dict[str, object]:
    """The ``torch.compile`` keywords of the config value ``compile``:
    ``True`` (none) or a dict of them; anything else, or a keyword
    ``torch.compile`` does not take, is a ``ValueError``."""
    if cfg is True:
        return {}
    if not isinstance(cfg, dict):
        raise ValueError(f'compile={cfg!r}: give True or a dict of '
                         'torch.compile options, e.g. compile=dict('
                         "backend='inductor', mode='max-autotune')")
    known = set(inspect.signature(torch.compile).parameters) - {'model'}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(f'compile: torch.compile takes no {unknown}; its '
                         f'options are {sorted(known)}')
    return dict(cfg)


def network_parts(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """(name, module) of every part :func:`compile_network` compiles."""
    parts = []

    def visit(name, module):
        if isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            for child_name, child in module.named_children():
                visit(f'{name}.{child_name}', child)
        else:
            parts.append((name, module))

    for name, child in model.named_children():
        if name not in NOT_NETWORK:
            visit(name, child)
    return parts


def compile_network(model: nn.Module, **options) -> List[str]:
    """Compiles the forward of every network part of ``model`` with
    ``torch.compile(**options)``; returns the parts' names. Needs torch
    :data:`COMPILE_MIN_TORCH` (a ``RuntimeError`` on older ones)."""
    if torch.__version__ < COMPILE_MIN_TORCH:
        raise RuntimeError(
            f'compile: torch.compile of MiTA needs torch >= '
            f'{COMPILE_MIN_TORCH} (this is {torch.__version__}; older '
            'releases fail to trace it or give wrong gradients); drop '
            'compile or upgrade torch')
    names = []
    for name, module in network_parts(model):
        module.forward = torch.compile(module.forward, **options)
        names.append(name)
    return names
