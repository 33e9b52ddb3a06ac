from .mita_attention import (BACKENDS, check_mita_args, compute_experts,
                             mita_attention, resolve_backend)

__all__ = [
    'BACKENDS', 'check_mita_args', 'compute_experts', 'mita_attention',
    'resolve_backend'
]
