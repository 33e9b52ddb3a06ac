"""The MiTA operator. Depends on PyTorch alone: importing it loads neither
mmseg, mmengine nor mmcv, and changes nothing in any library.

* :func:`mita_attention` (:mod:`.mita_attention`): input checks, backend
  dispatch;
* :class:`MiTAOptions` (:mod:`.options`): the landmark grid, top-k and
  variant, validated once where built;
* :mod:`.backends`: :class:`MiTABackend`, the registry and ``auto``'s
  priority list; the backends are :mod:`.torch_backend` (pure PyTorch, any
  device, every option), :mod:`.flash_backend` (flash-attn varlen, CUDA),
  :mod:`.triton_backend` (fused Triton kernels, optional triton) and
  :mod:`.export_backend` (standard ONNX operators, with
  :mod:`.fixed_pooling`); :mod:`.routing` groups queries by expert;
* :mod:`.experts`: the shared part (:func:`compute_experts`) that the torch
  and flash backends reuse, and its seam (:class:`MiTAExperts`);
* :func:`naive_mita` (:mod:`.naive`): the per-query definition the backends
  are tested against.
"""
from .backends import (AUTO_PRIORITY, REGISTRY, MiTABackend, backend_names,
                       register_backend, select_backend)
from .experts import MiTAExperts, compute_experts
from .mita_attention import check_inputs, mita_attention
from .naive import naive_mita
from .options import LANDMARKS, MiTAOptions

__all__ = [
    'AUTO_PRIORITY', 'LANDMARKS', 'MiTABackend', 'MiTAExperts',
    'MiTAOptions', 'REGISTRY', 'backend_names', 'check_inputs',
    'compute_experts', 'mita_attention', 'naive_mita', 'register_backend',
    'select_backend'
]
