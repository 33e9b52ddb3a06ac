"""Export of a whole mmseg segmentor to ONNX, and its check in ONNX Runtime.

The exported graph is mmseg's whole-mode inference, ``encode_decode``: the
normalised image ``[1, 3, H, W]`` (as the data preprocessor outputs it) in,
the logits ``[1, num_classes, H, W]`` (resized to the input, before argmax)
out. :func:`prepare_for_export` first switches, explicitly and in place,
the parts that have no ONNX form to equal computations that do (see
``docs/deploy.md``).
"""
import logging
import warnings
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.model import revert_sync_batchnorm
from mmengine.registry import init_default_scope
from mmengine.runner import load_checkpoint
from mmseg.models.backbones import VisionTransformer
from mmseg.models.utils.embed import AdaptivePadding
from mmseg.registry import MODELS
from torch import Tensor

from mmseg_mita.models.backbones.mita_vit import MiTAViT
from mmseg_mita.ops.fixed_pooling import FixedAdaptiveAvgPool2d
from mmseg_mita.utils import write_atomic

OPSET = 17
PRETRAINED_INITS = ('Pretrained', 'Pretrained_Part')


def _drop_pretrained(cfg):
    """Remove every pretrained-weights ``init_cfg`` (and ``pretrained``) of
    a model config, in place: nothing is downloaded or read."""
    if isinstance(cfg, dict):
        cfg.pop('pretrained', None)
        init = cfg.get('init_cfg')
        if isinstance(init, dict) and init.get('type') in PRETRAINED_INITS:
            cfg['init_cfg'] = None
        for value in cfg.values():
            _drop_pretrained(value)
    elif isinstance(cfg, (list, tuple)):
        for value in cfg:
            _drop_pretrained(value)


def build_segmentor(config: str,
                    checkpoint: Optional[str] = None,
                    cfg_options: Optional[dict] = None) -> nn.Module:
    """The config's segmentor on CPU in eval mode (BN instead of SyncBN),
    with the weights of ``checkpoint``, or initialised by its
    ``init_weights`` without pretrained weights when there is none."""
    import mmseg_mita.mmseg_plugin  # noqa: F401  (MiTA in mmseg)
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    model_cfg = cfg.model
    _drop_pretrained(model_cfg)
    model = MODELS.build(model_cfg)
    if checkpoint is None:
        logger = MMLogger.get_current_instance()
        level = logger.level
        logger.setLevel(logging.WARNING)  # not the per-parameter report
        try:
            model.init_weights()
        finally:
            logger.setLevel(level)
    else:
        load_checkpoint(model, checkpoint, map_location='cpu', strict=True)
    return revert_sync_batchnorm(model).eval()


class SegmentorLogits(nn.Module):
    """mmseg's whole-mode inference as a plain module: normalised images
    ``[B, 3, H, W]`` -> logits ``[B, num_classes, H, W]``
    (``encode_decode``: backbone, neck, decode head, resize to the input)."""

    def __init__(self, segmentor: nn.Module):
        super().__init__()
        self.segmentor = segmentor

    def forward(self, inputs: Tensor) -> Tensor:
        size = inputs.shape[2:]
        metas = [dict(img_shape=size, pad_shape=size)]
        return self.segmentor.encode_decode(inputs, metas)


def _resize_pos_embed_always(vit: VisionTransformer) -> None:
    """Make mmseg's ViT resize its position embedding on every call.

    ``VisionTransformer._pos_embeding`` adds the embedding unresized when
    the token count matches ``img_size``: a Python decision that a trace
    freezes, so a file exported at ``img_size`` would fail at any other
    size. Resizing (bicubic) to the trained grid itself is the identity.
    """
    pos_grid = (vit.img_size[0] // vit.patch_size,
                vit.img_size[1] // vit.patch_size)

    def pos_embeding(patched_img, hw_shape, pos_embed):
        pos_embed = vit.resize_pos_embed(pos_embed, hw_shape, pos_grid,
                                         vit.interpolate_mode)
        return vit.drop_after_pos(patched_img + pos_embed)

    vit._pos_embeding = pos_embeding


def _pad_traceably(padding: AdaptivePadding) -> None:
    """Make mmseg's ``AdaptivePadding`` compute its padding with tensor
    arithmetic: it reads the input size with ``math.ceil`` and decides in
    Python whether to pad, which a trace freezes at the export size."""
    if padding.padding != 'corner':
        raise ValueError('dynamic export supports patch padding "corner" '
                         f'(mmseg\'s default), got {padding.padding!r}')

    def pad_size(size, kernel, stride, dilation):
        # ceil(size / stride) as -floor(-size / stride), then mmcv's formula
        steps = -torch.div(-size, stride, rounding_mode='floor')
        return torch.clamp((steps - 1) * stride + (kernel - 1) * dilation +
                           1 - size, min=0)

    def forward(x):
        size = torch._shape_as_tensor(x)[-2:]
        pads = [
            pad_size(size[i], padding.kernel_size[i], padding.stride[i],
                     padding.dilation[i]) for i in (0, 1)
        ]
        return F.pad(x, [0, pads[1], 0, pads[0]])

    padding.forward = forward


def prepare_for_export(model: nn.Module, dynamic: bool = False) -> None:
    """Switch ``model`` in place to computations with an ONNX form:

    * MiTA backbones: ``backend='export'`` (``set_attention_backend``),
      the formulation of ``mmseg_mita.ops.export_backend``;
    * every ``nn.AdaptiveAvgPool2d`` (CBT's representatives, UPerNet's
      pyramid pooling) -> :class:`FixedAdaptiveAvgPool2d`, valid for sizes
      the pooling size does not divide;
    * ``dynamic``: mmseg ViTs resize their position embedding on every
      call (:func:`_resize_pos_embed_always`) and patch embeddings pad
      inputs to a multiple of the patch size in the graph
      (:func:`_pad_traceably`).

    The results equal the eager model's up to float rounding.
    """
    for module in model.modules():
        if isinstance(module, MiTAViT) and module.mita is not None:
            module.set_attention_backend('export')
        if dynamic and isinstance(module, VisionTransformer):
            _resize_pos_embed_always(module)
        if dynamic and isinstance(module, AdaptivePadding):
            _pad_traceably(module)
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.AdaptiveAvgPool2d:
                setattr(parent, name,
                        FixedAdaptiveAvgPool2d(child.output_size))


def export_onnx(model: nn.Module,
                shape: Tuple[int, int],
                path: str,
                dynamic: bool = False,
                opset: int = OPSET) -> None:
    """Export ``SegmentorLogits(model)`` (already prepared with
    :func:`prepare_for_export`) traced at ``[1, 3, *shape]`` to ``path``,
    written atomically; ``dynamic``: height and width are dynamic axes.

    The legacy TorchScript exporter (``dynamo=False``) records the traced
    sizes as graph values; its ``TracerWarning``s come from Python-level
    size checks (mmseg's and ours) and are silenced: the file is checked by
    running it (``tools/export_onnx.py``)."""
    wrapper = SegmentorLogits(model).eval()
    dummy = torch.randn(1, 3, *shape)
    axes = {
        'inputs': {
            2: 'height',
            3: 'width'
        },
        'logits': {
            2: 'height',
            3: 'width'
        }
    } if dynamic else None

    def write(tmp: str) -> None:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter('ignore', torch.jit.TracerWarning)
            warnings.simplefilter('ignore', DeprecationWarning)
            torch.onnx.export(wrapper, (dummy, ), tmp, dynamo=False,
                              opset_version=opset, input_names=['inputs'],
                              output_names=['logits'], dynamic_axes=axes)

    write_atomic(path, write)


def run_onnxruntime(path: str,
                    inputs: np.ndarray,
                    threads: int = 0) -> np.ndarray:
    """The logits of the ONNX file at ``path`` for ``inputs`` [1, 3, H, W]
    on ONNX Runtime's CPU provider (``threads=0``: its default)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(path, options,
                                   providers=['CPUExecutionProvider'])
    return session.run(None, {'inputs': inputs})[0]


def compare_logits(reference: np.ndarray,
                   logits: np.ndarray) -> Dict[str, float]:
    """``max_abs_diff`` of the logits [B, C, H, W] and ``agreement``, the
    fraction of pixels whose argmax class is the same."""
    if reference.shape != logits.shape:
        raise ValueError(f'logits of shape {logits.shape} do not match the '
                         f'reference {reference.shape}')
    agree = reference.argmax(1) == logits.argmax(1)
    return dict(
        max_abs_diff=float(np.abs(reference - logits).max()),
        agreement=float(agree.mean()))


def within_tolerance(result: Dict[str, float], atol: float,
                     min_agreement: float) -> bool:
    """Whether a :func:`compare_logits` result passes: ``max_abs_diff`` at
    most ``atol`` and ``agreement`` at least ``min_agreement``."""
    return (result['max_abs_diff'] <= atol
            and result['agreement'] >= min_agreement)


def torch_logits(model: nn.Module, inputs: Sequence[Tensor]):
    """Eager PyTorch logits of ``model`` for each input, as numpy."""
    wrapper = SegmentorLogits(model).eval()
    with torch.no_grad():
        return [wrapper(x).numpy() for x in inputs]
