"""The MiTA operator. Depends on PyTorch alone: importing it loads neither
mmseg, mmengine nor mmcv.

* :func:`mita_attention` (:mod:`.mita_attention`): argument checks, the
  shared part, backend dispatch;
* :mod:`.experts`: the shared part (:func:`compute_experts`) and the
  backend seam (:class:`MiTAExperts`, :data:`Backend`);
* backends: :mod:`.torch_backend` (pure PyTorch, any device),
  :mod:`.flash_backend` (flash-attn varlen, CUDA); :mod:`.routing` holds
  their index bookkeeping;
* :func:`naive_mita` (:mod:`.naive`): the per-query definition the backends
  are tested against.
"""
from .experts import LANDMARKS, Backend, MiTAExperts, compute_experts
from .mita_attention import (BACKENDS, check_mita_args, check_variant_args,
                             mita_attention, resolve_backend)
from .naive import naive_mita

__all__ = [
    'BACKENDS', 'Backend', 'LANDMARKS', 'MiTAExperts', 'check_mita_args',
    'check_variant_args', 'compute_experts', 'mita_attention', 'naive_mita',
    'resolve_backend'
]
