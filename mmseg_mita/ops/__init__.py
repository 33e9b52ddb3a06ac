"""The MiTA operator. Depends on PyTorch alone: importing it loads neither
mmseg, mmengine nor mmcv (nor triton), and changes nothing in any library.

* :func:`mita_attention` (:mod:`.mita_attention`): input checks, backend
  dispatch;
* :class:`MiTAOptions` (:mod:`.options`): the landmark grid, top-k and
  variant, validated once where built;
* :class:`MiTAPlan` (:mod:`.plan`): the options resolved against one
  call's inputs, built once per call; every backend runs as
  ``run(q, k, v, plan)``;
* :class:`MiTABackend` (:mod:`.declaration`): a backend's run function and
  what it computes, declared in the backend's own module:
  :mod:`.torch_backend` (pure PyTorch, any device, every option),
  :mod:`.flash_backend` (flash-attn varlen, CUDA), :mod:`.triton_backend`
  (fused Triton kernels, optional triton) and :mod:`.export_backend`
  (standard ONNX operators, with :mod:`.fixed_pooling`); :mod:`.routing`
  groups queries by expert;
* :mod:`.backends`: the registry that collects the declarations and
  ``auto``'s priority list;
* :mod:`.experts`: the shared part (:func:`compute_experts`) that the
  torch, flash and export backends reuse, and its seam
  (:class:`MiTAExperts`);
* :func:`naive_mita` (:mod:`.naive`): the per-query definition the backends
  are tested against.
"""
from .backends import (AUTO_PRIORITY, REGISTRY, backend_names, get_backend,
                       register_backend, select_backend)
from .declaration import MiTABackend
from .experts import MiTAExperts, compute_experts
from .mita_attention import check_inputs, mita_attention
from .naive import naive_mita
from .options import LANDMARKS, MiTAOptions
from .plan import MiTAPlan

__all__ = [
    'AUTO_PRIORITY', 'LANDMARKS', 'MiTABackend', 'MiTAExperts',
    'MiTAOptions', 'MiTAPlan', 'REGISTRY', 'backend_names', 'check_inputs',
    'compute_experts', 'get_backend', 'mita_attention', 'naive_mita',
    'register_backend', 'select_backend'
]
