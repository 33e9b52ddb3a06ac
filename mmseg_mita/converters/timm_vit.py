"""timm ``VisionTransformer`` weights -> mmseg ``VisionTransformer`` weights.

Every other source format is first renamed to timm's keys, so the structural
work happens here, exactly (no approximation):

* layer scale (``ls1.gamma``, ``ls2.gamma``; DeiT-III) is folded into the
  linear layer before it: ``g * (W x + b) = (g W) x + g b``;
* a pos-embed without a cls entry (DeiT-III, big_vision, no cls token) gets
  a zero row in front, since mmseg adds ``pos_embed[:, 0]`` to the cls token;
* a model without a cls token gets a zero one (and needs
  ``with_cls_token=False``, which drops it before the first layer);
* absent biases (no qkv bias, no patch-embedding bias) become zeros, so the
  output always loads with ``qkv_bias=True`` and ``patch_bias=True``;
* classification-only weights (``head``, ``fc_norm``, ``attn_pool``) are
  dropped.
"""
import re
from typing import Dict, List, NamedTuple, Tuple

import torch
from torch import Tensor

TOP_KEYS = {
    'patch_embed.proj.weight': 'patch_embed.projection.weight',
    'patch_embed.proj.bias': 'patch_embed.projection.bias',
    'cls_token': 'cls_token',
    'pos_embed': 'pos_embed',
    'norm_pre.weight': 'ln_pre.weight',
    'norm_pre.bias': 'ln_pre.bias',
    'norm.weight': 'ln1.weight',
    'norm.bias': 'ln1.bias',
}
BLOCK_KEYS = {
    'norm1.weight': 'ln1.weight',
    'norm1.bias': 'ln1.bias',
    'attn.qkv.weight': 'attn.attn.in_proj_weight',
    'attn.qkv.bias': 'attn.attn.in_proj_bias',
    'attn.proj.weight': 'attn.attn.out_proj.weight',
    'attn.proj.bias': 'attn.attn.out_proj.bias',
    'norm2.weight': 'ln2.weight',
    'norm2.bias': 'ln2.bias',
    'mlp.fc1.weight': 'ffn.layers.0.0.weight',
    'mlp.fc1.bias': 'ffn.layers.0.0.bias',
    'mlp.fc2.weight': 'ffn.layers.1.weight',
    'mlp.fc2.bias': 'ffn.layers.1.bias',
}
# layer scale -> the mmseg linear layer whose output it scales
LAYER_SCALE = {'ls1.gamma': 'attn.attn.out_proj', 'ls2.gamma': 'ffn.layers.1'}
CLASSIFIER_PREFIXES = ('head.', 'head_drop.', 'fc_norm.', 'attn_pool.')
UNSUPPORTED_HINTS = {
    'reg_token': 'register tokens',
    'dist_token': 'a DeiT distillation token',
    'q_norm': 'qk-norm',
    'k_norm': 'qk-norm',
    'attn.norm': 'scale_attn_norm',
    'mlp.norm': 'scale_mlp_norm',
    'patch_embed.norm': 'a norm in the patch embedding',
    'patch_embed.backbone': 'a hybrid CNN stem',
}
BLOCK_RE = re.compile(r'blocks\.(\d+)\.(.+)')
TIMM_FINGERPRINT = 'blocks.0.attn.qkv.weight'


class Converted(NamedTuple):
    """mmseg-named weights and what the conversion did to get them."""
    state_dict: Dict[str, Tensor]
    with_cls_token: bool
    notes: List[str]


def _unsupported_error(keys: List[str]) -> ValueError:
    hints = sorted({
        hint
        for key in keys for part, hint in UNSUPPORTED_HINTS.items()
        if part in key
    })
    found = f' ({", ".join(hints)})' if hints else ''
    return ValueError(
        f'weights {keys[:8]}{" ..." if len(keys) > 8 else ""} have no '
        f'counterpart in mmseg\'s VisionTransformer{found}; only plain ViTs '
        '(patch embedding, optional cls token, learned pos-embed, pre-norm '
        'blocks, optional layer scale, final norm) can be converted')


def _rename(sd: Dict[str, Tensor]) -> Tuple[Dict[str, Tensor], Dict[
        str, Tensor], List[str]]:
    """Split timm keys into mmseg-renamed weights, layer scales (by the
    mmseg linear they scale) and dropped classifier keys."""
    out, scales, dropped, unknown = {}, {}, [], []
    for key, value in sd.items():
        block = BLOCK_RE.fullmatch(key)
        if key in TOP_KEYS:
            out[TOP_KEYS[key]] = value
        elif block and block.group(2) in BLOCK_KEYS:
            out[f'layers.{block.group(1)}.{BLOCK_KEYS[block.group(2)]}'] = \
                value
        elif block and block.group(2) in LAYER_SCALE:
            scales[f'layers.{block.group(1)}.{LAYER_SCALE[block.group(2)]}'] \
                = value
        elif key.startswith(CLASSIFIER_PREFIXES):
            dropped.append(key)
        else:
            unknown.append(key)
    if unknown:
        raise _unsupported_error(unknown)
    return out, scales, dropped


def _fill_biases(out: Dict[str, Tensor], notes: List[str]) -> None:
    """Zero biases where the source had none (exact: adds nothing)."""
    weights = [k for k in out if k.endswith(('_weight', '.weight'))]
    filled = []
    for key in weights:
        bias = key[:-len('weight')] + 'bias'
        if bias not in out and out[key].dim() >= 2:
            out[bias] = out[key].new_zeros(out[key].shape[0])
            filled.append(bias)
    if filled:
        kinds = sorted({re.sub(r'layers\.\d+\.', 'layers.*.', k)
                        for k in filled})
        notes.append(f'zero biases added where the source has none: {kinds}')


def _fold_layer_scale(out: Dict[str, Tensor], scales: Dict[str, Tensor],
                      notes: List[str]) -> None:
    for linear, gamma in scales.items():
        out[linear + '.weight'] = out[linear + '.weight'] * gamma[:, None]
        out[linear + '.bias'] = out[linear + '.bias'] * gamma
    if scales:
        notes.append(f'layer scale folded into {len(scales)} linear layers '
                     '(attn out_proj / ffn fc2)')


def _pos_embed_with_cls_entry(pos: Tensor, has_cls: bool,
                              notes: List[str]) -> Tensor:
    """Pos-embed over [cls] + patches, as mmseg stores it."""
    if pos.dim() == 2:
        pos = pos[None]
    length = pos.shape[1]
    side = round((length - 1)**0.5)
    if has_cls and side * side == length - 1:
        return pos
    side = round(length**0.5)
    if side * side != length:
        raise ValueError(
            f'pos_embed has {length} entries: neither a square patch grid '
            f'nor 1 + a square grid; mmseg\'s VisionTransformer needs a '
            'square pos-embed grid (plus the cls entry)')
    notes.append('pos_embed has no cls entry: a zero one was put in front')
    return torch.cat([pos.new_zeros(1, 1, pos.shape[2]), pos], dim=1)


def timm_to_mmseg(sd: Dict[str, Tensor]) -> Converted:
    """Convert a timm ViT state dict to mmseg ``VisionTransformer`` keys."""
    if TIMM_FINGERPRINT not in sd:
        raise ValueError(f'not a timm ViT state dict: no {TIMM_FINGERPRINT!r}'
                         f' among its keys {sorted(sd)[:8]}')
    out, scales, dropped = _rename(sd)
    if 'pos_embed' not in out:
        raise ValueError("no learned position embedding 'pos_embed': ViTs "
                         "without one (pos_embed='none', RoPE) have no "
                         "counterpart in mmseg's VisionTransformer")
    notes = []
    if dropped:
        notes.append(f'dropped classification-only weights: {dropped}')
    _fill_biases(out, notes)
    _fold_layer_scale(out, scales, notes)
    has_cls = 'cls_token' in out
    if not has_cls:
        out['cls_token'] = out['pos_embed'].new_zeros(
            1, 1, out['pos_embed'].shape[-1])
        notes.append('no cls token: a zero one was added; configs need '
                     'with_cls_token=False')
    out['pos_embed'] = _pos_embed_with_cls_entry(out['pos_embed'], has_cls,
                                                 notes)
    return Converted(out, has_cls, notes)
