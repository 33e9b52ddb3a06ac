"""The MiTA backends, collected, and how one is chosen.

Every backend module declares itself (its ``BACKEND``, a
:class:`~.declaration.MiTABackend`: the run function and what it computes);
:data:`REGISTRY` collects them. A backend module that imports an optional
package at its top (:data:`DEFERRED`: the Triton kernels) is collected when
it is first asked for, so that importing :mod:`mmseg_mita.ops` loads no
optional package.

:func:`select_backend` answers ``backend='auto'`` by walking
:data:`AUTO_PRIORITY` and taking the first backend with no reason against
the call; when none can run, and when an explicitly named backend cannot,
it raises ``ValueError`` listing every reason of every candidate (the
pattern of xformers' ``fmha`` dispatch).
"""
from typing import Dict, Tuple

from torch import Tensor

from . import export_backend, flash_backend, torch_backend
from .declaration import MiTABackend, missing_module_reason, module_available
from .plan import MiTAPlan

REGISTRY: Dict[str, MiTABackend] = {}
# backend='auto' takes the first of these that can run. 'triton' is not
# here: it ran correctly on an H200, but not faster than 'torch' at every
# N (docs/gpu.md), so speed, not validation, keeps it out. 'export' is
# chosen explicitly (mmseg_mita.deploy.prepare_for_export).
AUTO_PRIORITY = ('flash', 'torch')
# The end of every refusal of a named backend.
_FALLBACK = ("Use backend='torch' (every device, dtype and option) or "
             "backend='auto'")


def _triton_backend() -> MiTABackend:
    # An import statement, not importlib: torch.compile traces it
    # (fullgraph) when the first call is a compiled one.
    from .triton_backend import BACKEND  # imports triton
    return BACKEND


# Backends collected on first use: name -> (the optional package that their
# module imports, the function that imports it and returns its BACKEND).
DEFERRED = {'triton': ('triton', _triton_backend)}


def register_backend(backend: MiTABackend) -> MiTABackend:
    """Add ``backend`` to :data:`REGISTRY` (its name must be new)."""
    if backend.name in REGISTRY or backend.name == 'auto':
        raise ValueError(f'a MiTA backend named {backend.name!r} exists')
    backend.available()  # looks its modules up now, not while dispatching
    REGISTRY[backend.name] = backend
    return backend


def backend_names() -> Tuple[str, ...]:
    """The values ``backend=`` accepts."""
    return ('auto', ) + tuple(sorted({*REGISTRY, *DEFERRED}))


def get_backend(name: str) -> MiTABackend:
    """The backend ``name`` (not ``'auto'``), collected from its module on
    first use if it is deferred; ``ValueError`` for an unknown name, or for
    a deferred backend whose package is not installed."""
    if name not in REGISTRY and name in DEFERRED:
        package, load = DEFERRED[name]
        if not module_available(package):
            raise ValueError(f'backend={name!r} cannot compute this call: '
                             f'{missing_module_reason(package)}. ' + _FALLBACK)
        register_backend(load())
    if name not in REGISTRY:
        raise ValueError(f'backend must be one of {backend_names()}, got '
                         f'{name!r}')
    return REGISTRY[name]


def select_backend(name: str, q: Tensor, k: Tensor, v: Tensor,
                   plan: MiTAPlan) -> MiTABackend:
    """The backend ``name`` (or, for ``'auto'``, the first of
    :data:`AUTO_PRIORITY` that can run); ``ValueError`` listing every reason
    of every candidate when none can run."""
    candidates = AUTO_PRIORITY if name == 'auto' else (name, )
    refused = {}
    for candidate in candidates:
        backend = get_backend(candidate)
        reasons = backend.not_supported_reasons(q, k, v, plan)
        if not reasons:
            return backend
        refused[candidate] = '; '.join(reasons)
    if name != 'auto':
        raise ValueError(f'backend={name!r} cannot compute this call: '
                         f'{refused[name]}. {_FALLBACK}')
    raise ValueError("backend='auto' found no backend that can compute this "
                     'call: ' + '. '.join(f'{candidate!r}: {reasons}'
                                          for candidate, reasons in
                                          refused.items()))

for _module in (torch_backend, flash_backend, export_backend):
    register_backend(_module.BACKEND)
for _package, _ in DEFERRED.values():
    module_available(_package)  # looked up now, not while dispatching
