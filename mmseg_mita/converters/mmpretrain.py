"""mmpretrain (mmcls) ``VisionTransformer`` backbone keys -> timm keys.

mmpretrain's names (``mmpretrain/models/backbones/vision_transformer.py``):
``patch_embed.projection``, ``cls_token``, ``pos_embed``, ``pre_norm``,
``layers.{i}.ln1``, ``layers.{i}.attn.qkv``, ``layers.{i}.attn.proj``,
``layers.{i}.attn.gamma1.weight`` (layer scale), ``layers.{i}.ln2``,
``layers.{i}.ffn.layers.0.0``, ``layers.{i}.ffn.layers.1``,
``layers.{i}.ffn.gamma2.weight``, ``ln1`` (final norm) and ``ln2`` (the norm
of ``out_type='avg_featmap'``, classification only).
"""
import re
from typing import Dict

from torch import Tensor

TOP = {
    'patch_embed.projection.': 'patch_embed.proj.',
    'pre_norm.': 'norm_pre.',
    'ln1.': 'norm.',
    'ln2.': 'fc_norm.',
}
BLOCK = {
    'ln1.': 'norm1.',
    'attn.qkv.': 'attn.qkv.',
    'attn.proj.': 'attn.proj.',
    'ln2.': 'norm2.',
    'ffn.layers.0.0.': 'mlp.fc1.',
    'ffn.layers.1.': 'mlp.fc2.',
}
LAYER_SCALE = {'attn.gamma1.weight': 'ls1.gamma',
               'ffn.gamma2.weight': 'ls2.gamma'}
LAYER_RE = re.compile(r'layers\.(\d+)\.(.+)')
MMPRETRAIN_FINGERPRINT = 'layers.0.attn.qkv.weight'


def _rename(key: str) -> str:
    layer = LAYER_RE.fullmatch(key)
    if layer:
        i, rest = layer.groups()
        if rest in LAYER_SCALE:
            return f'blocks.{i}.{LAYER_SCALE[rest]}'
        for old, new in BLOCK.items():
            if rest.startswith(old):
                return f'blocks.{i}.{new}{rest[len(old):]}'
    elif key in ('cls_token', 'pos_embed'):
        return key
    else:
        for old, new in TOP.items():
            if key.startswith(old):
                return new + key[len(old):]
    raise ValueError(f'mmpretrain weight {key!r} has no counterpart in '
                     "mmseg's VisionTransformer")


def mmpretrain_to_timm(backbone: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """mmpretrain ViT backbone state dict (no ``backbone.`` prefix) -> timm
    ViT state dict."""
    return {_rename(k): v for k, v in backbone.items()}
