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

The paper's variants (fields of :class:`~.options.MiTAOptions`): ``s =
experts_per_query`` routed experts per query (``m + s k`` keys, the top-s
experts by ``R_j . q_i``, best first, in one softmax), routing-only
(``shared_expert=False``: the ``s k`` routed keys alone) and
compression-only (``routed_experts=False``: the ``m`` compressed keys
alone, i.e. plain attention over ``[s R ; Vt]``).

:func:`mita_attention` checks its inputs, resolves the options against
them once (:class:`~.plan.MiTAPlan`) and hands both to a backend of
:mod:`.backends`, ``run(q, k, v, plan)`` (the torch, flash and export
backends reuse the shared part, :func:`~.experts.compute_experts`). The
plain per-query definition is :func:`~.naive.naive_mita`.
"""
from typing import Optional, Tuple

from torch import Tensor

from mmseg_mita.utils import IntPair, check_int, check_int_pair
from .backends import select_backend
from .options import MiTAOptions, as_options
from .plan import MiTAPlan


def check_inputs(q: Tensor, k: Tensor, v: Tensor, hw: IntPair,
                 num_extra_tokens: int,
                 options: MiTAOptions) -> Tuple[int, int]:
    """Validate what depends on the inputs (the options are valid by
    construction): shapes, the patch grid, the landmark grid inside it.

    Returns ``hw`` as a pair; raises ``ValueError`` naming the offending
    parameter otherwise.
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
    pool_size = options.pool_size
    if pool_size[0] > hw[0] or pool_size[1] > hw[1]:
        raise ValueError(
            f'pool_size={pool_size} is larger than the patch grid hw={hw}: '
            'there cannot be more landmarks than patches along an axis; use '
            f'pool_size <= {hw} (a larger input or a smaller pool_size, or '
            'MiTAOptions.fitted(hw))')
    if options.landmarks == 'official' and num_extra_tokens != 1:
        raise ValueError(
            "landmarks='official' pools the first H * W tokens (the cls "
            'token and all patches but the last), which needs exactly one '
            f'extra (cls) token, got num_extra_tokens={num_extra_tokens}; '
            "use landmarks='patches'")
    return hw


def _has_tensors(hw: IntPair) -> bool:
    return not isinstance(hw, int) and any(isinstance(s, Tensor) for s in hw)


def _values(hw: IntPair) -> IntPair:
    """``hw`` with traced sizes (0-dim tensors) read as ints."""
    return tuple(int(s) for s in hw) if _has_tensors(hw) else hw


def mita_attention(q: Tensor,
                   k: Tensor,
                   v: Tensor,
                   hw: IntPair,
                   *,
                   num_extra_tokens: int = 1,
                   options: Optional[MiTAOptions] = None,
                   backend: str = 'auto',
                   dropout_p: float = 0.0,
                   **option_fields) -> Tensor:
    """MiTA attention of ``q``, ``k``, ``v`` of shape [B, heads, N, head_dim].

    Args:
        hw: the patch grid (H, W); ``N = num_extra_tokens + H * W``.
        num_extra_tokens: tokens before the patches (the cls token).
        options: a :class:`~.options.MiTAOptions` (landmark grid, top-k,
            variant), built and validated once by the caller; or, instead,
            its fields as keywords (``pool_size=7, topk=49``, validated on
            every call). The defaults are the paper's m = k = 49.
        backend: a name of :func:`~.backends.backend_names`: 'torch'
            (any device and dtype, every option), 'flash' (flash-attn on
            CUDA, fp16/bf16, ``experts_per_query=1``), 'triton' (Triton
            kernels on CUDA, or on CPU under ``TRITON_INTERPRET=1``;
            float32/fp16/bf16, head_dim <= 128, the default variant, no
            dropout), 'export' (standard ONNX operators, inference only,
            the default variant: see ``export_backend``), or 'auto': the
            first backend of :data:`~.backends.AUTO_PRIORITY` that can run
            (flash where it applies, else torch; triton ran correctly on an
            H200 but is not chosen until it is faster at every size,
            docs/gpu.md). A backend that cannot run, or an 'auto' that
            finds none, raises ``ValueError`` with every reason.
        dropout_p: dropout on the attention probabilities.

    Returns:
        Tensor of the shape of ``q``.
    """
    options = as_options(options, option_fields)
    # Under ONNX export tracing, hw holds traced sizes: their values are
    # checked, and the plan keeps them traced (as it does N).
    checked = check_inputs(q, k, v, _values(hw), num_extra_tokens, options)
    if not 0 <= dropout_p < 1:
        raise ValueError(f'dropout_p must be in [0, 1), got {dropout_p!r}')
    plan = MiTAPlan.build(q, hw if _has_tensors(hw) else checked,
                          num_extra_tokens, options, dropout_p)
    return select_backend(backend, q, k, v, plan).run(q, k, v, plan)
