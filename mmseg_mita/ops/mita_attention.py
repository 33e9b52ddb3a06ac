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
"""
from typing import NamedTuple, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .export_backend import mita_export
from .flash_backend import flash_attn_available, mita_flash
from .torch_backend import mita_torch, softmax_fp32

BACKENDS = ('auto', 'torch', 'flash', 'export')

IntPair = Union[int, Sequence[int]]


class MiTAExperts(NamedTuple):
    """What every backend needs, computed once from q, k and v.

    Shapes use ``G = B * num_heads`` flattened groups:
    ``landmarks`` [G, m, d]; ``shared_values`` (Vt) [G, m, d];
    ``route_logits`` [G, N, m]: ``s^2 q . R``, the compressed logits (the
    argmax over m routes each query: the scale does not change it);
    ``expert`` (argmax routing) [G, N]; ``topk_index`` [G, m, k].
    """
    landmarks: Tensor
    shared_values: Tensor
    route_logits: Tensor
    expert: Tensor
    topk_index: Tensor


def _pair(value: IntPair, name: str) -> Tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    value = tuple(value)
    if len(value) != 2 or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f'{name} must be an int or a pair of ints, '
                         f'got {value!r}')
    return value


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
    hw = _pair(hw, 'hw')
    if min(hw) < 1:
        raise ValueError(f'hw must be positive, got {hw}')
    if not isinstance(num_extra_tokens, int) or num_extra_tokens < 0:
        raise ValueError('num_extra_tokens must be an int >= 0, '
                         f'got {num_extra_tokens!r}')
    n = q.shape[2]
    if n != num_extra_tokens + hw[0] * hw[1]:
        raise ValueError(
            f'hw={hw} does not match the number of tokens: N={n} but '
            f'num_extra_tokens + H * W = {num_extra_tokens} + '
            f'{hw[0]} * {hw[1]} = {num_extra_tokens + hw[0] * hw[1]}; pass '
            'the patch grid of these tokens and the number of extra '
            '(cls) tokens in front of them')
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f'topk must be an int >= 1, got {topk!r}')
    pool_size = _pair(pool_size, 'pool_size')
    if min(pool_size) < 1:
        raise ValueError(f'pool_size must be >= 1, got {pool_size}')
    if pool_size[0] > hw[0] or pool_size[1] > hw[1]:
        raise ValueError(
            f'pool_size={pool_size} is larger than the patch grid hw={hw}: '
            'there cannot be more landmarks than patches along an axis; use '
            f'pool_size <= {hw} (a larger input or a smaller pool_size)')
    return hw, pool_size


def compute_experts(q: Tensor, k: Tensor, v: Tensor, hw: Tuple[int, int],
                    num_extra_tokens: int, pool_size: Tuple[int, int],
                    topk: int) -> MiTAExperts:
    """Landmarks, shared expert, routing and top-k selection.

    ``R . K^T`` serves both the top-k selection and the shared expert;
    ``R . Q^T`` serves both the routing and the compressed logits.
    """
    b, h, n, d = q.shape
    g = b * h
    q, k, v = (t.reshape(g, n, d) for t in (q, k, v))
    patches = q[:, num_extra_tokens:].transpose(1, 2).reshape(g, d, *hw)
    landmarks = F.adaptive_avg_pool2d(patches, pool_size).flatten(2)
    landmarks = landmarks.transpose(1, 2)  # [G, m, d]
    key_logits = landmarks @ k.transpose(1, 2)  # [G, m, N]
    topk_index = key_logits.topk(min(topk, n), dim=-1, sorted=False).indices
    shared_probs = softmax_fp32(key_logits.mul_(d**-0.5))
    shared_values = shared_probs.to(v.dtype) @ v
    route_logits = q @ (landmarks * d**-1).transpose(1, 2)  # [G, N, m]
    expert = route_logits.argmax(dim=-1)
    return MiTAExperts(landmarks, shared_values, route_logits, expert,
                       topk_index)


def _has_tensors(hw: IntPair) -> bool:
    return not isinstance(hw, int) and any(isinstance(s, Tensor) for s in hw)


def _values(hw: IntPair) -> IntPair:
    """``hw`` with traced sizes (0-dim tensors) read as ints."""
    return tuple(int(s) for s in hw) if _has_tensors(hw) else hw


def resolve_backend(backend: str, q: Tensor) -> str:
    """Pick a backend: 'flash' for fp16/bf16 CUDA tensors when flash-attn is
    installed, 'torch' otherwise."""
    if backend not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS}, '
                         f'got {backend!r}')
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
            CUDA, fp16/bf16), 'auto', or 'export' (standard ONNX operators,
            forward only, for export to ONNX: see ``export_backend``).
        dropout_p: dropout on the attention probabilities.

    Returns:
        Tensor of the shape of ``q``.
    """
    # Under ONNX export tracing, hw holds traced sizes: check their values,
    # and let the export backend compute with the traced sizes.
    traced_hw = hw if _has_tensors(hw) else None
    hw, pool_size = check_mita_args(q, k, v, _values(hw), num_extra_tokens,
                                    pool_size, topk)
    if not 0 <= dropout_p < 1:
        raise ValueError(f'dropout_p must be in [0, 1), got {dropout_p!r}')
    backend = resolve_backend(backend, q)
    if backend == 'export':
        if dropout_p > 0:
            raise ValueError("backend='export' is inference only: use "
                             'dropout_p=0 (call model.eval() before export)')
        return mita_export(q, k, v, traced_hw or hw, num_extra_tokens,
                           pool_size, topk)
    experts = compute_experts(q, k, v, hw, num_extra_tokens, pool_size, topk)
    run = mita_flash if backend == 'flash' else mita_torch
    return run(q, k, v, experts, dropout_p)
