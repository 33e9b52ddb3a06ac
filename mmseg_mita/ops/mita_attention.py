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

The paper's variants (options of :func:`mita_attention`): ``s =
experts_per_query`` routed experts per query (``m + s k`` keys, the top-s
experts by ``R_j . q_i``, best first, in one softmax), routing-only
(``shared_expert=False``: the ``s k`` routed keys alone) and
compression-only (``routed_experts=False``: the ``m`` compressed keys
alone, i.e. plain attention over ``[s R ; Vt]``).

:func:`mita_attention` checks its arguments, computes the shared part
(:func:`~.experts.compute_experts`) and hands it to a backend (the seam is
documented in :mod:`.experts`). The plain per-query definition is
:func:`~.naive.naive_mita`.
"""
import importlib.util
from typing import Dict, Tuple

import torch
from torch import Tensor

from mmseg_mita.utils import IntPair, check_choice, check_int, check_int_pair
from .experts import LANDMARKS, Backend, compute_experts
from .export_backend import mita_export
from .flash_backend import flash_attn_available, mita_flash
from .torch_backend import mita_torch

BACKENDS = ('auto', 'torch', 'flash', 'triton', 'export')

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


def check_variant_args(experts_per_query: int, shared_expert: bool,
                       routed_experts: bool, landmarks: str,
                       num_extra_tokens: int, num_landmarks: int,
                       prefix: str = '') -> None:
    """Validate the variant options of :func:`mita_attention` (``prefix``
    goes in front of the parameter names, e.g. ``'mita_cfg.'``)."""
    check_int(experts_per_query, f'{prefix}experts_per_query')
    for name, value in (('shared_expert', shared_expert),
                        ('routed_experts', routed_experts)):
        if not isinstance(value, bool):
            raise ValueError(f'{prefix}{name} must be True or False, got '
                             f'{value!r}')
    if not (shared_expert or routed_experts):
        raise ValueError(
            f'{prefix}shared_expert and {prefix}routed_experts cannot both '
            'be False: there would be no key to attend to; keep at least '
            'one (shared_expert=False is routing-only, routed_experts=False '
            'compression-only)')
    if routed_experts and experts_per_query > num_landmarks:
        raise ValueError(
            f'{prefix}experts_per_query={experts_per_query} is more than the '
            f'm={num_landmarks} experts (landmarks); use experts_per_query '
            f'<= {num_landmarks} or a larger pool_size')
    if not routed_experts and experts_per_query != 1:
        raise ValueError(
            f'{prefix}experts_per_query={experts_per_query} has no effect '
            f'with {prefix}routed_experts=False (compression-only routes '
            'no query); leave it at 1')
    check_choice(landmarks, f'{prefix}landmarks', LANDMARKS)
    if landmarks == 'official' and num_extra_tokens != 1:
        raise ValueError(
            f"{prefix}landmarks='official' pools the first H * W tokens "
            '(the cls token and all patches but the last), which needs '
            f'exactly one extra (cls) token, got num_extra_tokens='
            f"{num_extra_tokens}; use landmarks='patches'")


def _has_tensors(hw: IntPair) -> bool:
    return not isinstance(hw, int) and any(isinstance(s, Tensor) for s in hw)


def _values(hw: IntPair) -> IntPair:
    """``hw`` with traced sizes (0-dim tensors) read as ints."""
    return tuple(int(s) for s in hw) if _has_tensors(hw) else hw


def resolve_backend(backend: str, q: Tensor,
                    experts_per_query: int = 1) -> str:
    """Pick a backend: 'flash' for fp16/bf16 CUDA tensors when flash-attn is
    installed and ``experts_per_query`` is 1 (flash computes one expert per
    query), 'torch' otherwise."""
    check_choice(backend, 'backend', BACKENDS)
    if backend == 'auto':
        fast = (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
                and q.shape[-1] <= 256 and q.shape[-1] % 8 == 0
                and experts_per_query <= 1)
        return 'flash' if fast and flash_attn_available() else 'torch'
    if backend == 'flash' and not flash_attn_available():
        raise ValueError(
            "backend='flash' needs flash-attn on a CUDA machine: install it "
            "with `pip install -e .[flash]`, or use backend='torch'")
    if backend == 'triton' and importlib.util.find_spec('triton') is None:
        raise ValueError(
            "backend='triton' needs triton (shipped with CUDA builds of "
            "PyTorch; `pip install triton`), or use backend='torch'")
    return backend


def mita_attention(q: Tensor,
                   k: Tensor,
                   v: Tensor,
                   hw: IntPair,
                   *,
                   num_extra_tokens: int = 1,
                   pool_size: IntPair = 7,
                   topk: int = 49,
                   experts_per_query: int = 1,
                   shared_expert: bool = True,
                   routed_experts: bool = True,
                   landmarks: str = 'patches',
                   backend: str = 'auto',
                   dropout_p: float = 0.0) -> Tensor:
    """MiTA attention of ``q``, ``k``, ``v`` of shape [B, heads, N, head_dim].

    Args:
        hw: the patch grid (H, W); ``N = num_extra_tokens + H * W``.
        num_extra_tokens: tokens before the patches (the cls token).
        pool_size: landmark grid (ph, pw) or an int; ``m = ph * pw``.
        topk: keys per routed expert; ``topk >= N`` means every key.
        experts_per_query: ``s``, the routed experts of each query (its
            ``s`` best by ``R_j . q``, at most ``m``); its softmax covers
            ``m + s * k`` logits, a key chosen by two of its experts twice.
        shared_expert: ``False`` leaves out the ``m`` compressed keys
            (routing-only: the softmax covers the ``s * k`` routed keys).
        routed_experts: ``False`` leaves out the routed keys
            (compression-only: the softmax covers the ``m`` compressed
            keys; no top-k is computed).
        landmarks: ``'patches'`` pools the queries of the ``H x W`` patches;
            ``'official'`` pools the first ``H * W`` tokens of the sequence
            laid out on the grid, as the authors' code does (``q[:, :-1]``:
            the cls token and every patch but the last), and needs exactly
            one extra token. The default pools each landmark's own cell of
            patches: under ``'official'`` every window is shifted by one
            token (each grid cell holds the patch before it, the first cell
            of a row the last patch of the row above), the cls query is
            mixed into the first landmark and the last patch into none.
            Use ``'official'`` for checkpoints trained with the authors'
            code.
        backend: 'torch' (any device, any dtype, every option), 'flash'
            (flash-attn on CUDA, fp16/bf16, ``experts_per_query=1``),
            'triton' (Triton kernels on CUDA, or on CPU under
            ``TRITON_INTERPRET=1``; float32/fp16/bf16, head_dim <= 128, the
            default variant, no dropout), 'export' (standard ONNX operators,
            forward only, the default variant: see ``export_backend``) or
            'auto' (flash where it applies,
            else torch; never 'triton' until a GPU run of
            ``tools/gpu_check.sh`` has validated it).
        dropout_p: dropout on the attention probabilities.

    Returns:
        Tensor of the shape of ``q``.
    """
    # Under ONNX export tracing, hw holds traced sizes: check their values,
    # and let the export backend compute with the traced sizes.
    traced_hw = hw if _has_tensors(hw) else None
    hw, pool_size = check_mita_args(q, k, v, _values(hw), num_extra_tokens,
                                    pool_size, topk)
    check_variant_args(experts_per_query, shared_expert, routed_experts,
                       landmarks, num_extra_tokens,
                       pool_size[0] * pool_size[1])
    if not 0 <= dropout_p < 1:
        raise ValueError(f'dropout_p must be in [0, 1), got {dropout_p!r}')
    backend = resolve_backend(backend, q, experts_per_query)
    if backend == 'export':
        if dropout_p > 0:
            raise ValueError("backend='export' is inference only: use "
                             'dropout_p=0 (call model.eval() before export)')
        if (experts_per_query, shared_expert, routed_experts,
                landmarks) != (1, True, True, 'patches'):
            raise ValueError(
                "backend='export' computes the default variant only "
                "(experts_per_query=1, shared_expert=True, "
                "routed_experts=True, landmarks='patches')")
        return mita_export(q, k, v, traced_hw or hw, num_extra_tokens,
                           pool_size, topk)
    if backend == 'triton':  # optional dependency: imported on use
        from .triton_backend import mita_triton as run
    else:
        run = _BACKEND_FUNCTIONS[backend]
    experts = compute_experts(q, k, v, hw, num_extra_tokens, pool_size, topk,
                              experts_per_query=experts_per_query,
                              shared_expert=shared_expert,
                              routed_experts=routed_experts,
                              landmarks=landmarks)
    return run(q, k, v, experts, dropout_p)
