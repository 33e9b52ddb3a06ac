"""The MiTA backends: what each computes, and how one is chosen.

Every backend is a :class:`MiTABackend` in :data:`REGISTRY`: a function
that computes MiTA, and a declaration of what it supports (devices, compute
dtypes, head_dim, variants, dropout, gradients, the modules it needs). A
backend either reuses the shared part (:func:`~.experts.compute_experts`,
then ``fn(q, k, v, experts, dropout_p)``: torch, flash) or computes
everything itself from ``q``, ``k``, ``v`` (triton: fused kernels from
the landmarks on; export).

:func:`select_backend` answers ``backend='auto'`` by walking
:data:`AUTO_PRIORITY` and taking the first backend with no reason against
the inputs; an explicitly named backend that cannot run raises
``ValueError`` listing every reason (the pattern of xformers' ``fmha``
dispatch).
"""
import dataclasses
import importlib.util
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .experts import compute_dtype, compute_experts
from .export_backend import mita_export
from .flash_backend import mita_flash  # imports flash-attn only when run
from .torch_backend import mita_torch
from .options import LANDMARKS, MiTAOptions

# run(q, k, v, hw, num_extra_tokens, options, dropout_p) -> out
RunFn = Callable[..., Tensor]

ALL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
HALF_DTYPES = (torch.float16, torch.bfloat16)
# What to install for a missing module.
INSTALL = {
    'triton': '`pip install triton` (shipped with CUDA builds of PyTorch)',
    'flash_attn': '`pip install -e .[flash]` on a CUDA machine',
}


@dataclasses.dataclass(frozen=True)
class MiTABackend:
    """A backend and what it supports.

    ``run(q, k, v, hw, num_extra_tokens, options, dropout_p)`` gets checked
    arguments (``hw`` as ints, or traced sizes for a backend with
    ``traced_sizes``) and returns the output [B, heads, N, d].
    ``max_experts_per_query``: ``None`` for any; ``ablations``: routing-only
    and compression-only; ``requires``: modules that must be importable;
    ``checks``: further reasons of the backend's own, ``checks(q) ->
    [reason]``, asked only when its modules are there.
    """
    name: str
    run: RunFn
    devices: Tuple[str, ...] = ('cpu', 'cuda')
    dtypes: Tuple[torch.dtype, ...] = ALL_DTYPES
    max_head_dim: Optional[int] = None
    head_dim_multiple: int = 1
    max_experts_per_query: Optional[int] = None
    ablations: bool = True
    landmarks: Tuple[str, ...] = LANDMARKS
    dropout: bool = True
    backward: bool = True
    requires: Tuple[str, ...] = ()
    checks: Optional[Callable[[Tensor], List[str]]] = None
    traced_sizes: bool = False

    def not_supported_reasons(self, q: Tensor, k: Tensor, v: Tensor,
                              options: MiTAOptions,
                              dropout_p: float) -> List[str]:
        """Why this backend cannot compute MiTA of these inputs with these
        options (empty if it can)."""
        reasons = [
            f'needs the module {name}: {INSTALL.get(name, "install it")}'
            for name in self.requires if not _AVAILABLE[name]
        ]
        if q.device.type not in self.devices:
            reasons.append(f'computes on {"/".join(self.devices)}, got '
                           f'{q.device.type} tensors')
        dtype = compute_dtype(q, v)
        if dtype not in self.dtypes:
            reasons.append(f'computes in {_names(self.dtypes)}, got {dtype}')
        d = q.shape[-1]
        if self.max_head_dim is not None and d > self.max_head_dim:
            reasons.append(f'supports head_dim <= {self.max_head_dim}, got '
                           f'{d}')
        if d % self.head_dim_multiple:
            reasons.append(f'needs head_dim a multiple of '
                           f'{self.head_dim_multiple}, got {d}')
        s = options.experts_per_query
        if self.max_experts_per_query is not None and \
                s > self.max_experts_per_query:
            reasons.append(f'computes experts_per_query <= '
                           f'{self.max_experts_per_query}, got {s}')
        if not self.ablations and not (options.shared_expert
                                       and options.routed_experts):
            reasons.append('computes both experts only (shared_expert=True, '
                           'routed_experts=True)')
        if options.landmarks not in self.landmarks:
            reasons.append(f'computes landmarks in {self.landmarks}, got '
                           f'{options.landmarks!r}')
        if dropout_p > 0 and not self.dropout:
            reasons.append(f'does not implement attention dropout (dropout_p='
                           f'{dropout_p}); call model.eval() or use '
                           'dropout_p=0')
        if not self.backward and torch.is_grad_enabled() and any(
                t.requires_grad for t in (q, k, v)):
            reasons.append('computes the forward only: run it under '
                           'torch.no_grad() (inference)')
        if not reasons and self.checks is not None:
            reasons.extend(self.checks(q))
        return reasons


REGISTRY: Dict[str, MiTABackend] = {}
# backend='auto' takes the first of these that can run. 'triton' is not
# here: it ran correctly on an H200, but not faster than 'torch' at every
# N (docs/gpu.md), so speed, not validation, keeps it out. 'export' is
# chosen explicitly (mmseg_mita.deploy.prepare_for_export).
AUTO_PRIORITY = ('flash', 'torch')


def register_backend(backend: MiTABackend) -> MiTABackend:
    """Add ``backend`` to :data:`REGISTRY` (its name must be new)."""
    if backend.name in REGISTRY or backend.name == 'auto':
        raise ValueError(f'a MiTA backend named {backend.name!r} exists')
    for name in backend.requires:
        if name not in _AVAILABLE:
            _AVAILABLE[name] = importlib.util.find_spec(name) is not None
    REGISTRY[backend.name] = backend
    return backend


def backend_names() -> Tuple[str, ...]:
    """The values ``backend=`` accepts."""
    return ('auto', ) + tuple(REGISTRY)


def select_backend(name: str, q: Tensor, k: Tensor, v: Tensor,
                   options: MiTAOptions, dropout_p: float) -> MiTABackend:
    """The backend ``name`` (or, for ``'auto'``, the first of
    :data:`AUTO_PRIORITY` that can run); ``ValueError`` listing every
    reason when it cannot run."""
    if name == 'auto':
        for candidate in AUTO_PRIORITY:
            backend = REGISTRY[candidate]
            if not backend.not_supported_reasons(q, k, v, options,
                                                 dropout_p):
                return backend
        name = AUTO_PRIORITY[-1]  # cannot run: say why
    if name not in REGISTRY:
        raise ValueError(f'backend must be one of {backend_names()}, got '
                         f'{name!r}')
    backend = REGISTRY[name]
    reasons = backend.not_supported_reasons(q, k, v, options, dropout_p)
    if reasons:
        raise ValueError(
            f"backend={name!r} cannot compute this call: " +
            '; '.join(reasons) + ". Use backend='torch' (every device, "
            "dtype and option) or backend='auto'")
    return backend


# Whether each module a backend requires is installed: looked up once, when
# the backend is registered (dispatch stays plain Python that torch.compile
# traces without a break).
_AVAILABLE: Dict[str, bool] = {}


def _names(dtypes: Sequence[torch.dtype]) -> str:
    return '/'.join(str(t).replace('torch.', '') for t in dtypes)


def with_experts(fn: Callable) -> RunFn:
    """A backend's ``run`` from ``fn(q, k, v, experts, dropout_p)``: the
    shared part is :func:`~.experts.compute_experts`."""

    def run(q, k, v, hw, num_extra_tokens, options, dropout_p):
        experts = compute_experts(q, k, v, hw, num_extra_tokens, options)
        return fn(q, k, v, experts, dropout_p)

    return run


def _triton_run(q, k, v, hw, num_extra_tokens, options, dropout_p):
    from .triton_backend import mita_triton  # fused: the shared part too
    return mita_triton(q, k, v, hw, num_extra_tokens, options.pool_size,
                       options.topk, options.landmarks)


def _triton_checks(q: Tensor) -> List[str]:
    from .triton_backend import interpreted
    if q.device.type == 'cpu' and not interpreted():
        return ['runs on CPU tensors only in Triton\'s interpreter: set '
                'TRITON_INTERPRET=1 before triton is first imported (slow, '
                'for tests)']
    return []


def _export_run(q, k, v, hw, num_extra_tokens, options, dropout_p):
    return mita_export(q, k, v, hw, num_extra_tokens, options.pool_size,
                       options.topk)


register_backend(MiTABackend('torch', with_experts(mita_torch)))
register_backend(
    MiTABackend('flash', with_experts(mita_flash), devices=('cuda', ),
                dtypes=HALF_DTYPES, max_head_dim=256, head_dim_multiple=8,
                max_experts_per_query=1, requires=('flash_attn', )))
register_backend(
    MiTABackend('triton', _triton_run,
                dtypes=(torch.float32, ) + HALF_DTYPES, max_head_dim=128,
                max_experts_per_query=1, ablations=False, dropout=False,
                requires=('triton', ), checks=_triton_checks))
register_backend(
    MiTABackend('export', _export_run, max_experts_per_query=1,
                ablations=False, landmarks=('patches', ), dropout=False,
                backward=False, traced_sizes=True))
