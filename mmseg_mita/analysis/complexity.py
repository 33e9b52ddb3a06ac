"""FLOPs and parameters of a segmentor, attention included.

mmengine's ``FlopAnalyzer`` traces the inference path (backbone, neck,
decode head; no auxiliary head, no final resize to the image, as mmseg's
``get_flops``) with the handles of :mod:`.flop_handles` added. The
attention part is the backbone's token-mixing matmuls: the ops named in
``ATTENTION_OPS`` that run inside an attention module (mmcv's or torch's
``MultiheadAttention``, MiTA's included); the qkv and output projections
are ``linear`` and not part of it.
"""
import contextlib
from typing import Dict, Iterator, Sequence

import torch
import torch.nn as nn
from mmcv.cnn.bricks.transformer import MultiheadAttention
from mmengine.analysis import FlopAnalyzer, parameter_count

from mmseg_mita.models.backbones import mita_vit
from mmseg_mita.utils import check_int_pair
from .flop_handles import ATTENTION_OPS, FLOP_HANDLES, call_mita_op

ATTENTION_MODULES = (MultiheadAttention, nn.MultiheadAttention)


@contextlib.contextmanager
def mita_as_one_op() -> Iterator[Dict[str, int]]:
    """Within the context, MiTA-ViT layers run MiTA through the traced op
    ``mmseg_mita_flops::mita_attention`` (same results; the function that
    ``MiTAMultiheadAttention`` calls is swapped, and restored on exit), and
    torch's fused ``nn.MultiheadAttention`` fast path is off, so that
    attention appears in a trace as ops the handles count. Yields
    ``{'calls': n}``, the number of MiTA calls made inside."""
    calls = {'calls': 0}

    def counted(*args, **kwargs):
        calls['calls'] += 1
        return call_mita_op(*args, **kwargs)

    original = mita_vit.mita_attention
    fastpath = torch.backends.mha.get_fastpath_enabled()
    mita_vit.mita_attention = counted
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield calls
    finally:
        mita_vit.mita_attention = original
        torch.backends.mha.set_fastpath_enabled(fastpath)


def flop_analyzer(model: nn.Module, inputs) -> FlopAnalyzer:
    """mmengine's ``FlopAnalyzer`` with this package's handles, quiet."""
    analyzer = FlopAnalyzer(model, inputs).set_op_handle(**FLOP_HANDLES)
    return (analyzer.unsupported_ops_warnings(False)
            .uncalled_modules_warnings(False).tracer_warnings('none'))


def attention_flops(analyzer: FlopAnalyzer, model: nn.Module,
                    prefix: str = '') -> int:
    """Token-mixing FLOPs of the outermost attention modules of ``model``
    (named with ``prefix`` in ``analyzer``)."""
    by_module = analyzer.by_module_and_operator()
    total, inside = 0, []
    for name, module in model.named_modules(prefix=prefix):
        if not isinstance(module, ATTENTION_MODULES) or any(
                name.startswith(outer + '.') for outer in inside):
            continue
        inside.append(name)
        ops = by_module[name]
        total += sum(ops[op] for op in ATTENTION_OPS)
    return total


class _InferencePath(nn.Module):
    """``segmentor`` from image to decode-head logits, each part called as
    a module so that the trace attributes its ops to it."""

    def __init__(self, segmentor: nn.Module):
        super().__init__()
        self.segmentor = segmentor

    def forward(self, inputs):
        return self.segmentor.decode_head(
            self.segmentor.extract_feat(inputs))


def _num_mita_layers(model: nn.Module) -> int:
    return sum(
        getattr(m, 'mita', None) is not None for m in model.modules()
        if isinstance(m, mita_vit.MiTAMultiheadAttention))


def segmentor_complexity(segmentor: nn.Module,
                         shape: Sequence[int]) -> Dict[str, int]:
    """FLOPs and parameters of ``segmentor`` (an mmseg ``EncoderDecoder``,
    in eval mode) on one ``3 x H x W`` image.

    Returns ints: ``flops``, ``backbone_flops``, ``attention_flops``,
    ``neck_flops``, ``decode_head_flops``, ``params`` (inference path:
    backbone, neck, decode head; ``auxiliary_head_params`` separately).
    """
    shape = check_int_pair(shape, 'shape')
    if segmentor.training:
        raise ValueError('segmentor is in training mode: call '
                         'segmentor.eval() first (inference is counted)')
    path = _InferencePath(segmentor)
    inputs = (torch.randn(1, 3, *shape), )
    with mita_as_one_op() as mita_calls, torch.no_grad():
        analyzer = flop_analyzer(path, inputs)
        total = analyzer.total()
    expected = _num_mita_layers(segmentor)
    if mita_calls['calls'] != expected:
        raise RuntimeError(
            f'{expected} MiTA layers but {mita_calls["calls"]} calls of the '
            'counted MiTA op: the backbone no longer calls '
            'mmseg_mita.models.backbones.mita_vit.mita_attention, update '
            'mmseg_mita.analysis.mita_as_one_op')

    def part(name):
        if getattr(segmentor, name, None) is None:
            return 0
        return analyzer.total(f'segmentor.{name}')

    params = parameter_count(segmentor)
    aux = params.get('auxiliary_head', 0)
    return dict(
        flops=int(total),
        backbone_flops=int(part('backbone')),
        attention_flops=int(
            attention_flops(analyzer, segmentor.backbone,
                            'segmentor.backbone')),
        neck_flops=int(part('neck')),
        decode_head_flops=int(part('decode_head')),
        params=int(params[''] - aux),
        auxiliary_head_params=int(aux))
