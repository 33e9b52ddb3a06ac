"""What a MiTA backend is: a run function and the declaration of what it
computes.

Each backend module defines its ``BACKEND``, a :class:`MiTABackend`, next
to the code that honours it; :mod:`.backends` collects them. The
dispatcher refuses a call outside a backend's declaration before the
backend sees it, naming each reason, so a backend never checks its own
limits again.
"""
import dataclasses
import importlib.util
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .experts import compute_dtype
from .options import LANDMARKS
from .plan import MiTAPlan

# run(q, k, v, plan) -> out
RunFn = Callable[[Tensor, Tensor, Tensor, MiTAPlan], Tensor]

ALL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
HALF_DTYPES = (torch.float16, torch.bfloat16)
# What to install for a missing module.
INSTALL = {
    'triton': '`pip install triton` (shipped with CUDA builds of PyTorch)',
    'flash_attn': '`pip install -e .[flash]` on a CUDA machine',
}

# Whether each module a backend requires is installed: looked up once, the
# first time it is asked for (the registry asks when it collects a
# backend), so that dispatch stays plain Python that torch.compile traces
# without a break.
_AVAILABLE: Dict[str, bool] = {}


def module_available(name: str) -> bool:
    """Whether the module ``name`` can be imported (looked up once)."""
    if name not in _AVAILABLE:
        _AVAILABLE[name] = importlib.util.find_spec(name) is not None
    return _AVAILABLE[name]


def missing_module_reason(name: str) -> str:
    """The reason given for a required module that is not installed."""
    return f'needs the module {name}: {INSTALL.get(name, "install it")}'


@dataclasses.dataclass(frozen=True)
class MiTABackend:
    """A backend and what it supports.

    ``run(q, k, v, plan)`` gets checked inputs ``[B, heads, N, d]`` and the
    call's :class:`~.plan.MiTAPlan`, and returns the output
    ``[B, heads, N, d]``. ``max_experts_per_query``: ``None`` for any;
    ``ablations``: routing-only and compression-only; ``requires``: modules
    that must be importable; ``checks``: further reasons of the backend's
    own, ``checks(q) -> [reason]``, asked only when nothing else is against
    the call.
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

    def available(self) -> bool:
        """Whether every module it requires is installed."""
        return all(module_available(name) for name in self.requires)

    def not_supported_reasons(self, q: Tensor, k: Tensor, v: Tensor,
                              plan: MiTAPlan) -> List[str]:
        """Why this backend cannot compute MiTA of these inputs with this
        plan (empty if it can)."""
        reasons = [
            missing_module_reason(name) for name in self.requires
            if not module_available(name)
        ]
        if q.device.type not in self.devices:
            reasons.append(f'computes on {"/".join(self.devices)}, got '
                           f'{q.device.type} tensors')
        dtype = compute_dtype(q, v)
        if dtype not in self.dtypes:
            reasons.append(f'computes in {_names(self.dtypes)}, got {dtype}')
        d = plan.head_dim
        if self.max_head_dim is not None and d > self.max_head_dim:
            reasons.append(f'supports head_dim <= {self.max_head_dim}, got '
                           f'{d}')
        if d % self.head_dim_multiple:
            reasons.append(f'needs head_dim a multiple of '
                           f'{self.head_dim_multiple}, got {d}')
        s = plan.experts_per_query
        if self.max_experts_per_query is not None and \
                s > self.max_experts_per_query:
            reasons.append(f'computes experts_per_query <= '
                           f'{self.max_experts_per_query}, got {s}')
        if not self.ablations and not (plan.shared_expert
                                       and plan.routed_experts):
            reasons.append('computes both experts only (shared_expert=True, '
                           'routed_experts=True)')
        if plan.landmarks not in self.landmarks:
            reasons.append(f'computes landmarks in {self.landmarks}, got '
                           f'{plan.landmarks!r}')
        if plan.dropout_p > 0 and not self.dropout:
            reasons.append(f'does not implement attention dropout (dropout_p='
                           f'{plan.dropout_p}); call model.eval() or use '
                           'dropout_p=0')
        if not self.backward and torch.is_grad_enabled() and any(
                t.requires_grad for t in (q, k, v)):
            reasons.append('computes the forward only: run it under '
                           'torch.no_grad() (inference)')
        if not reasons and self.checks is not None:
            reasons.extend(self.checks(q))
        return reasons


def _names(dtypes: Sequence[torch.dtype]) -> str:
    return '/'.join(str(t).replace('torch.', '') for t in dtypes)
