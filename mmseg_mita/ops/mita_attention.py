"""MiTA attention: a mixture of top-k activations (arXiv 2602.01219).

Per head, with ``s = head_dim ** -0.5`` and the ``N`` tokens laid out as
``num_extra_tokens`` extra tokens (cls) followed by an ``H x W`` patch grid:

* landmarks ``R`` (``m = ph * pw`` of them) are the adaptive average pooling
  of the patch queries to ``ph x pw``;
* expert ``j`` is routed: its keys are the ``topk`` keys ``T_j`` with the
  largest ``R_j . K`` (over all ``N`` tokens, no scale);
* the shared expert has keys ``s R`` and values ``Vt = softmax(s R K^T) V``;
* query ``i`` goes to expert ``e_i = argmax_j R_j . q_i`` and takes ONE
  softmax over ``[s q_i . s R_j]_j ++ [s q_i . K_t]_{t in T_{e_i}}`` applied
  to ``[Vt_j] ++ [V_t]``.

Every query therefore sees ``m + k`` keys instead of ``N``. The operator has
no parameters, so a full-attention checkpoint runs under it unchanged.

:func:`mita_attention` checks its arguments, computes the shared part
(:func:`~.experts.compute_experts`) and hands it to a backend (the seam is
documented in :mod:`.experts`). The plain per-query definition is
:func:`~.naive.naive_mita`.
"""
from typing import Dict, Tuple

import torch
from torch import Tensor

from mmseg_mita.utils import IntPair, check_choice, check_int, check_int_pair
from .experts import Backend, compute_experts
from .flash_backend import flash_attn_available, mita_flash
from .torch_backend import mita_torch

BACKENDS = ('auto', 'torch', 'flash')

_BACKEND_FUNCTIONS: Dict[str, Backend] = dict(torch=mita_torch,
                                              flash=mita_flash)


def check_mita_args(q: Tensor, k: Tensor, v: Tensor, hw: IntPair,
                    num_extra_tokens: int, pool_size: IntPair,
                    topk: int) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """Validate the arguments of :func:`mita_attention`.

    Returns ``hw`` and ``pool_size`` as pairs; raises ``ValueError`` naming
    the offending parameter otherwise.
    """
    if q.dim() != 4:
        raise ValueError('q must have shape [B, num_heads, N, head_dim], '
                         f'got {tuple(q.shape)}')
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError('q, k and v must have the same shape '
                         '[B, num_heads, N, head_dim], got '
                         f'q={tuple(q.shape)}, k={tuple(k.shape)}, '
                         f'v={tuple(v.shape)}')
    hw = check_int_pair(hw, 'hw')
    check_int(num_extra_tokens, 'num_extra_tokens', minimum=0)
    n = q.shape[2]
    if n != num_extra_tokens + hw[0] * hw[1]:
        raise ValueError(
            f'hw={hw} does not match the number of tokens: N={n} but '
            f'num_extra_tokens + H * W = {num_extra_tokens} + '
            f'{hw[0]} * {hw[1]} = {num_extra_tokens + hw[0] * hw[1]}; pass '
            'the patch grid of these tokens and the number of extra '
            '(cls) tokens in front of them')
    check_int(topk, 'topk')
    pool_size = check_int_pair(pool_size, 'pool_size')
    if pool_size[0] > hw[0] or pool_size[1] > hw[1]:
        raise ValueError(
            f'pool_size={pool_size} is larger than the patch grid hw={hw}: '
            'there cannot be more landmarks than patches along an axis; use '
            f'pool_size <= {hw} (a larger input or a smaller pool_size)')
    return hw, pool_size


def resolve_backend(backend: str, q: Tensor) -> str:
    """Pick a backend: 'flash' for fp16/bf16 CUDA tensors when flash-attn is
    installed, 'torch' otherwise."""
    check_choice(backend, 'backend', BACKENDS)
    if backend == 'auto':
        fast = (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
                and q.shape[-1] <= 256 and q.shape[-1] % 8 == 0)
        return 'flash' if fast and flash_attn_available() else 'torch'
    if backend == 'flash' and not flash_attn_available():
        raise ValueError(
            "backend='flash' needs flash-attn on a CUDA machine: install it "
            "with `pip install -e .[flash]`, or use backend='torch'")
    return backend


def mita_attention(q: Tensor,
                   k: Tensor,
                   v: Tensor,
                   hw: IntPair,
                   *,
                   num_extra_tokens: int = 1,
                   pool_size: IntPair = 7,
                   topk: int = 49,
                   backend: str = 'auto',
                   dropout_p: float = 0.0) -> Tensor:
    """MiTA attention of ``q``, ``k``, ``v`` of shape [B, heads, N, head_dim].

    Args:
        hw: the patch grid (H, W); ``N = num_extra_tokens + H * W``.
        num_extra_tokens: tokens before the patches (the cls token).
        pool_size: landmark grid (ph, pw) or an int; ``m = ph * pw``.
        topk: keys per routed expert; ``topk >= N`` means every key.
        backend: 'torch' (any device, any dtype), 'flash' (flash-attn on
            CUDA, fp16/bf16) or 'auto'.
        dropout_p: dropout on the attention probabilities.

    Returns:
        Tensor of the shape of ``q``.
    """
    hw, pool_size = check_mita_args(q, k, v, hw, num_extra_tokens, pool_size,
                                    topk)
    if not 0 <= dropout_p < 1:
        raise ValueError(f'dropout_p must be in [0, 1), got {dropout_p!r}')
    run = _BACKEND_FUNCTIONS[resolve_backend(backend, q)]
    experts = compute_experts(q, k, v, hw, num_extra_tokens, pool_size, topk)
    return run(q, k, v, experts, dropout_p)
