"""Tell a ViT checkpoint's format by its content and convert it."""
import os.path as osp
from typing import Any, Dict, List, NamedTuple, Optional

import torch
from torch import Tensor

from mmseg_mita.utils import write_atomic
from .augreg import npz_prefix, npz_to_timm
from .loading import NpzWeights, read_checkpoint
from .mita_deit import (GATE_FINGERPRINT, VALUE_BRANCH_KEYS,
                        split_value_branch, training_args_note)
from .mmpretrain import MMPRETRAIN_FINGERPRINT, mmpretrain_to_timm
from .settings import BackboneSettings, infer_settings
from .timm_vit import (BLOCK_KEYS, BLOCK_RE, TIMM_FINGERPRINT, TOP_KEYS,
                       timm_to_mmseg)

FORMATS = ('timm', 'deit', 'augreg', 'mmpretrain', 'mmseg')
MMSEG_FINGERPRINT = 'layers.0.attn.attn.in_proj_weight'
FINGERPRINTS = {  # key naming -> keys of which every such ViT has one
    'timm': (TIMM_FINGERPRINT, GATE_FINGERPRINT),
    'mmpretrain': (MMPRETRAIN_FINGERPRINT, ),
    'mmseg': (MMSEG_FINGERPRINT, ),
}
EXPECTED = {
    'timm': f'a timm state dict (keys like {TIMM_FINGERPRINT!r}), plain or '
    "under 'state_dict' (.pth/.bin/.safetensors)",
    'deit': "a DeiT checkpoint {'model': timm state dict} (also the "
    "authors' MiTA-DeiT, with 'attn.dwc' / 'attn.qkvg' keys)",
    'augreg': 'a NumPy .npz of AugReg/big_vision weights '
    "('embedding/kernel', 'Transformer/encoderblock_0/...')",
    'mmpretrain': "an mmpretrain/mmcls checkpoint {'state_dict': "
    f"{{'backbone.{MMPRETRAIN_FINGERPRINT}': ...}}}} or its backbone",
    'mmseg': "an mmseg checkpoint {'state_dict': "
    f"{{'backbone.{MMSEG_FINGERPRINT}': ...}}}} or its backbone",
}
MMSEG_TOP = set(TOP_KEYS.values())
MMSEG_LAYER = set(BLOCK_KEYS.values()) | set(VALUE_BRANCH_KEYS)


class Detected(NamedTuple):
    format: str
    weights: Any  # state dict (backbone part) or NpzWeights
    where: str  # where in the file the weights were found
    other_parts: Dict[str, int]  # e.g. {'decode_head': 20}: not converted


class Conversion(NamedTuple):
    state_dict: Dict[str, Tensor]
    settings: BackboneSettings
    format: str
    notes: List[str]


def _split_backbone(sd: Dict[str, Any]):
    """The ``backbone.`` part of a model state dict (prefix removed) and the
    number of keys of each other part; ``sd`` itself if it has none."""
    if not any(k.startswith('backbone.') for k in sd):
        return sd, {}
    backbone, others = {}, {}
    for key, value in sd.items():
        if key.startswith('backbone.'):
            backbone[key[len('backbone.'):]] = value
        else:
            part = key.split('.')[0]
            others[part] = others.get(part, 0) + 1
    return backbone, others


def detect_format(obj: Any) -> Detected:
    """The format of checkpoint content ``obj``, from its keys alone."""
    if isinstance(obj, NpzWeights):
        npz_prefix(obj)  # raises if no ViT weights
        return Detected('augreg', obj, '.npz arrays', {})
    expected = '; '.join(f'{f}: {e}' for f, e in EXPECTED.items())
    if not isinstance(obj, dict):
        raise ValueError(f'a checkpoint must hold a dict of weights, got '
                         f'{type(obj).__name__}; expected {expected}')
    found = []
    for container in (None, 'model', 'state_dict'):
        sd = obj if container is None else obj.get(container)
        if not isinstance(sd, dict):
            continue
        backbone, others = _split_backbone(sd)
        for naming, keys in FINGERPRINTS.items():
            if any(key in backbone for key in keys):
                fmt = 'deit' if naming == 'timm' and container == 'model' \
                    else naming
                where = 'top level' if container is None else \
                    f'{container!r}'
                if others:
                    where += ", 'backbone.' keys"
                found.append(Detected(fmt, backbone, where, others))
    if not found:
        sample = sorted(map(str, obj))[:8]
        raise ValueError(f'no ViT weights recognised (top-level keys '
                         f'{sample}); expected {expected}')
    formats = sorted({d.format for d in found})
    if len(formats) > 1:
        raise ValueError(f'inconsistent checkpoint: it holds ViT weights in '
                         f'several formats {formats} '
                         f'({[d.where for d in found]}); keep one')
    return found[0]


def _check_mmseg_keys(sd: Dict[str, Tensor]) -> None:
    unknown = []
    for key in sd:
        layer = BLOCK_RE.fullmatch(key.replace('layers.', 'blocks.', 1))
        if key not in MMSEG_TOP and not (layer
                                         and layer.group(2) in MMSEG_LAYER):
            unknown.append(key)
    if unknown:
        raise ValueError(f'backbone weights {unknown[:8]} are not those of '
                         "mmseg's VisionTransformer")


def convert(obj: Any, fmt: str = 'auto',
            num_heads: Optional[int] = None) -> Conversion:
    """Convert checkpoint content ``obj`` (see :func:`read_checkpoint`) to
    mmseg ``VisionTransformer`` weights and the settings they imply.

    Args:
        fmt: 'auto' or one of :data:`FORMATS`; an explicit format must
            match what the content is.
        num_heads: heads of the model (torch weights do not store it).
    """
    if fmt != 'auto' and fmt not in FORMATS:
        raise ValueError(f'format must be auto or one of {FORMATS}, '
                         f'got {fmt!r}')
    try:
        found = detect_format(obj)
    except ValueError as err:
        if fmt == 'auto':
            raise
        raise ValueError(f'expected {EXPECTED[fmt]}: {err}') from err
    if fmt not in ('auto', found.format):
        raise ValueError(f'--format {fmt} expects {EXPECTED[fmt]}, but this '
                         f'is {EXPECTED[found.format]} (found at '
                         f'{found.where})')
    notes = [f'{found.format} weights found at {found.where}']
    if found.other_parts:
        notes.append(f'kept the backbone; left out {found.other_parts}')
    heads_in_weights = None
    if found.format == 'mmseg':
        sd, with_cls = dict(found.weights), True
        _check_mmseg_keys(sd)
        notes.append('mmseg weights always hold a cls token, so '
                     'with_cls_token is not known from them: keep the '
                     'setting of the config the checkpoint was trained with')
    else:
        if found.format == 'augreg':
            timm_sd, heads_in_weights, npz_notes = npz_to_timm(found.weights)
            notes += npz_notes
        elif found.format == 'mmpretrain':
            timm_sd = mmpretrain_to_timm(found.weights)
        else:
            timm_sd = found.weights
            notes += training_args_note(obj)
        branch = split_value_branch(timm_sd)
        sd, with_cls, timm_notes = timm_to_mmseg(branch.timm_state_dict)
        sd.update(branch.extra)
        notes += branch.notes + timm_notes
    settings = infer_settings(sd, with_cls, heads_in_weights, num_heads)
    return Conversion(sd, settings, found.format, notes)


def convert_file(src: str, fmt: str = 'auto',
                 num_heads: Optional[int] = None) -> Conversion:
    """:func:`convert` the checkpoint file ``src``."""
    return convert(read_checkpoint(src), fmt, num_heads)


def write_checkpoint(conversion: Conversion, dst: str, src: str,
                     force: bool = False) -> None:
    """Save ``{'state_dict', 'meta'}`` atomically; an existing ``dst`` is
    kept unless ``force``."""
    if osp.exists(dst) and not force:
        raise FileExistsError(f'{dst} exists; pass --force to overwrite it')
    if osp.exists(src) and osp.exists(dst) and osp.samefile(src, dst):
        raise ValueError(f'DST {dst} is the source file; choose another path')
    meta = dict(converted_from=osp.basename(src),
                source_format=conversion.format,
                backbone=conversion.settings.backbone_cfg())
    write_atomic(dst, lambda tmp: torch.save(
        {'state_dict': conversion.state_dict, 'meta': meta}, tmp))
