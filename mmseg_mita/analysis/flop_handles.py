"""FLOP handles for mmengine's jit-trace analysis (``FlopAnalyzer``).

mmseg's convention: one multiply-add is one FLOP; softmax, scaling and
other elementwise work are not counted. mmengine's defaults count
``bmm``/``matmul``/``linear``/convolutions but give 0 for
``scaled_dot_product_attention`` and ``baddbmm`` (and for the index ops of
MiTA). The handles here add:

* ``aten::scaled_dot_product_attention``: ``Q K^T`` and ``A V``;
* ``aten::baddbmm``: its batched matmul (``nn.MultiheadAttention`` with a
  mask);
* ``mmseg_mita_flops::mita_attention``: the whole MiTA operator, counted
  from its shapes (:func:`mita_op_flops`), so the count does not depend on
  how a backend pads, sorts or gathers. The op wraps
  :func:`mmseg_mita.ops.mita_attention` (see
  :func:`mmseg_mita.analysis.mita_as_one_op`) so that tracing records one
  node instead of the backend's data-dependent internals.
"""
import dataclasses
from collections import Counter
from math import prod
from typing import Any, Dict, List, Sequence

import torch
from mmengine.analysis.jit_handles import get_shape

from mmseg_mita.ops import MiTAOptions, mita_attention
from mmseg_mita.ops.options import as_options

MITA_OP = 'mmseg_mita_flops::mita_attention'

# The parts of MiTA, as op names in the analyzer's counters.
MITA_MATMULS = ('mita_key_logits', 'mita_shared_values', 'mita_routing',
                'mita_routed_logits', 'mita_weighted_sum')

# The op's schema carries every field of MiTAOptions, typed from its value.
_SCHEMA_TYPES = {int: 'int', bool: 'bool', str: 'str', tuple: 'int[]'}
_OPTION_FIELDS = [(f.name, _SCHEMA_TYPES[type(f.default)])
                  for f in dataclasses.fields(MiTAOptions)]
_ARGS = 3 + 2  # q, k, v, hw, num_extra_tokens come first

_LIB = torch.library.Library('mmseg_mita_flops', 'DEF')
_LIB.define('mita_attention(Tensor q, Tensor k, Tensor v, int[] hw, '
            'int num_extra_tokens, ' +
            ''.join(f'{kind} {name}, ' for name, kind in _OPTION_FIELDS) +
            'str backend, float dropout_p) -> Tensor')


def _mita_impl(q, k, v, hw, num_extra_tokens, *args):
    *fields, backend, dropout_p = args
    options = MiTAOptions(**{
        name: tuple(value) if kind == 'int[]' else value
        for (name, kind), value in zip(_OPTION_FIELDS, fields)
    })
    return mita_attention(q, k, v, tuple(hw),
                          num_extra_tokens=num_extra_tokens, options=options,
                          backend=backend, dropout_p=dropout_p)


_LIB.impl('mita_attention', _mita_impl, 'CompositeExplicitAutograd')


def _constant(val: Any) -> Any:
    """The Python value of a traced constant (int or list of ints)."""
    if val.node().kind() == 'prim::ListConstruct':
        return [_constant(i) for i in val.node().inputs()]
    value = val.toIValue()
    if value is None:
        raise ValueError(f'expected a constant in the trace, got {val}')
    return value


def mita_op_flops(batch: int, heads: int, tokens: int, head_dims: int,
                  num_extra_tokens: int,
                  options: MiTAOptions) -> Dict[str, int]:
    """FLOPs of MiTA with ``options`` on ``[batch, heads, tokens,
    head_dims]`` q/k/v.

    With ``C = heads * head_dims``, ``m`` landmarks, ``k = min(topk, N)``
    and ``s`` experts per query: ``R K^T`` (top-k selection, shared
    expert's logits) and ``R Q^T`` (routing, reused as the compressed
    logits) cost ``m N C`` each in every variant; the shared values
    ``softmax(s R K^T) V`` ``m N C`` with a shared expert; the routed
    logits ``N s k C`` with routed experts; the weighted sum ``N (m + s k)
    C``, without the ``m`` (routing-only) or the ``s k`` (compression-only)
    values. The landmark pooling reads ``H * W`` queries once.
    """
    c = batch * heads * head_dims
    n, m = tokens, options.num_landmarks
    routed = (min(options.topk, tokens) * options.experts_per_query
              if options.routed_experts else 0)
    shared = m if options.shared_expert else 0
    return dict(
        mita_key_logits=m * n * c,
        mita_shared_values=shared * n * c,
        mita_routing=m * n * c,
        mita_routed_logits=n * routed * c,
        mita_weighted_sum=n * (shared + routed) * c,
        mita_landmark_pool=(n - num_extra_tokens) * c)


def mita_flop_jit(inputs: List[Any], outputs: List[Any]) -> Counter:
    """Handle for :data:`MITA_OP`."""
    batch, heads, tokens, head_dims = get_shape(inputs[0])
    fields = {
        name: _constant(value)
        for (name, _), value in zip(_OPTION_FIELDS, inputs[_ARGS:])
    }
    options = MiTAOptions(**fields)
    return Counter(
        mita_op_flops(batch, heads, tokens, head_dims,
                      _constant(inputs[4]), options))


def sdpa_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """``scaled_dot_product_attention(q, k, v, ...)``: ``Q K^T`` and
    ``A V``, for any leading batch dims."""
    q, k, v = (get_shape(t) for t in inputs[:3])
    return prod(q[:-1]) * k[-2] * (q[-1] + v[-1])


def baddbmm_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """``baddbmm(input, batch1, batch2)``: the batched matmul."""
    b, n, c = get_shape(inputs[1])
    return b * n * c * get_shape(inputs[2])[-1]


FLOP_HANDLES = {
    MITA_OP: mita_flop_jit,
    'aten::scaled_dot_product_attention': sdpa_flop_jit,
    'aten::baddbmm': baddbmm_flop_jit,
}

# Op names (as the analyzer reports them) that are attention's token-mixing
# matmuls when they run inside an attention module.
ATTENTION_OPS = ('bmm', 'baddbmm', 'matmul', 'einsum',
                 'scaled_dot_product_attention') + MITA_MATMULS


def call_mita_op(q, k, v, hw: Sequence[int], *, num_extra_tokens: int = 1,
                 options=None, backend: str = 'auto',
                 dropout_p: float = 0.0, **option_fields):
    """:func:`mmseg_mita.ops.mita_attention` as the single traced op
    :data:`MITA_OP` (same signature, same result)."""
    options = as_options(options, option_fields)
    fields = [
        list(value) if isinstance(value, tuple) else value
        for value in dataclasses.astuple(options)
    ]
    return torch.ops.mmseg_mita_flops.mita_attention(
        q, k, v, list(hw), num_extra_tokens, *fields, backend,
        float(dropout_p))
