"""The ``VisionTransformer`` settings that a converted checkpoint implies."""
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from torch import Tensor

# heads of the standard ViT sizes (Ti/S/B/L/H); not stored in torch weights
STANDARD_HEADS = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}
REQUIRED = ('cls_token', 'pos_embed', 'patch_embed.projection.weight')
LAYER_KEYS = ('ln1.weight', 'ln1.bias', 'attn.attn.in_proj_weight',
              'attn.attn.out_proj.weight',
              'ln2.weight', 'ln2.bias', 'ffn.layers.0.0.weight',
              'ffn.layers.0.0.bias', 'ffn.layers.1.weight',
              'ffn.layers.1.bias')


@dataclass
class BackboneSettings:
    """Arguments of mmseg's ``VisionTransformer`` that must match the
    weights; ``num_heads`` is None when it cannot be known."""
    embed_dims: int
    num_layers: int
    num_heads: Optional[int]
    heads_source: str
    mlp_ratio: int
    patch_size: int
    in_channels: int
    pos_grid: Tuple[int, int]
    with_cls_token: bool
    final_norm: bool
    pre_norm: bool
    patch_bias: bool
    qkv_bias: bool
    dwc: bool = False  # MiTAViT only: the authors' depth-wise value conv
    gate: bool = False  # MiTAViT only: the authors' output gate

    def backbone_cfg(self) -> Dict:
        """Config entries for ``model.backbone`` (LN eps 1e-6 as in timm,
        AugReg and mmpretrain ViTs; the weights do not store it)."""
        cfg = dict(
            img_size=(self.pos_grid[0] * self.patch_size,
                      self.pos_grid[1] * self.patch_size),
            patch_size=self.patch_size,
            in_channels=self.in_channels,
            embed_dims=self.embed_dims,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            mlp_ratio=self.mlp_ratio,
            qkv_bias=self.qkv_bias,
            with_cls_token=self.with_cls_token,
            patch_bias=self.patch_bias,
            pre_norm=self.pre_norm,
            final_norm=self.final_norm,
            norm_cfg=dict(type='LN', eps=1e-6))
        if self.num_heads is None:
            del cfg['num_heads']
        for flag in ('dwc', 'gate'):  # MiTAViT's, so only when needed
            if getattr(self, flag):
                cfg[flag] = True
        return cfg

    def describe(self) -> List[str]:
        heads = (f'{self.num_heads} ({self.heads_source})'
                 if self.num_heads else f'unknown ({self.heads_source})')
        h, w = self.pos_grid
        return [
            f'embed_dims:     {self.embed_dims}',
            f'num_layers:     {self.num_layers}',
            f'num_heads:      {heads}',
            f'mlp_ratio:      {self.mlp_ratio}',
            f'patch_size:     {self.patch_size}',
            f'in_channels:    {self.in_channels}',
            f'pos-embed grid: {h} x {w} (img_size {h * self.patch_size} x '
            f'{w * self.patch_size}; mmseg resizes it to the config\'s '
            'img_size when loading)',
            f'with_cls_token: {self.with_cls_token}',
            f'final_norm:     {self.final_norm}',
            f'pre_norm:       {self.pre_norm}',
            f'patch_bias:     {self.patch_bias}',
            f'qkv_bias:       {self.qkv_bias}',
            f'dwc:            {self.dwc} (depth-wise value conv, '
            'layers.*.attn.dwc)',
            f'gate:           {self.gate} (SiLU output gate, '
            'layers.*.attn.gate_proj)',
        ]


def _layer_count(sd: Dict[str, Tensor]) -> int:
    indices = sorted({int(m.group(1)) for m in
                      (re.match(r'layers\.(\d+)\.', k) for k in sd) if m})
    if not indices or indices != list(range(len(indices))):
        raise ValueError(f'transformer layers {indices} are not 0..depth-1')
    missing = [f'layers.{i}.{k}' for i in indices for k in LAYER_KEYS
               if f'layers.{i}.{k}' not in sd]
    if missing:
        raise ValueError(f'weights are incomplete: missing {missing[:6]}')
    return len(indices)


def _value_branch(sd: Dict[str, Tensor], num_layers: int, name: str,
                  weight_shape: Tuple[int, ...]) -> bool:
    """Whether every layer has ``attn.{name}`` (of the right shapes) or
    none has; ValueError otherwise."""
    have = [i for i in range(num_layers)
            if f'layers.{i}.attn.{name}.weight' in sd]
    if not have:
        return False
    if len(have) != num_layers:
        raise ValueError(
            f'attn.{name} weights are in layers {have} only: MiTAViT has '
            f'them in every layer (of {num_layers}) or in none')
    for i in have:
        for kind, shape in (('weight', weight_shape),
                            ('bias', weight_shape[:1])):
            key = f'layers.{i}.attn.{name}.{kind}'
            if key not in sd or tuple(sd[key].shape) != shape:
                found = tuple(sd[key].shape) if key in sd else 'missing'
                raise ValueError(
                    f'{key} is {found}; MiTAViT\'s attn.{name} needs '
                    f'{kind} {shape}' + (' (a 3 x 3 depth-wise kernel)'
                                         if name == 'dwc' else ''))
    return True


def resolve_heads(embed_dims: int, from_weights: Optional[int],
                  requested: Optional[int]) -> Tuple[Optional[int], str]:
    """Number of heads and where it comes from. The weights (AugReg .npz)
    win; torch weights do not store it, so ``requested`` (--num-heads) or
    the standard ViT table decide."""
    if requested is not None:
        if requested < 1 or embed_dims % requested:
            raise ValueError(f'--num-heads {requested} must divide '
                             f'embed_dims={embed_dims}')
        if from_weights is not None and from_weights != requested:
            raise ValueError(f'--num-heads {requested} contradicts the '
                             f'{from_weights} heads stored in the weights')
        return requested, '--num-heads'
    if from_weights is not None:
        return from_weights, 'from the weights'
    if embed_dims in STANDARD_HEADS:
        return STANDARD_HEADS[embed_dims], (
            'standard ViT-Ti/S/B/L/H table; torch weights do not store it, '
            'pass --num-heads if your model differs')
    return None, ('torch weights do not store it and embed_dims is not a '
                  'standard ViT size: pass --num-heads')


def infer_settings(sd: Dict[str, Tensor], with_cls_token: bool,
                   heads_in_weights: Optional[int] = None,
                   requested_heads: Optional[int] = None
                   ) -> BackboneSettings:
    """Settings implied by an mmseg-named ``VisionTransformer`` state dict
    (heads: see :func:`resolve_heads`)."""
    missing = [k for k in REQUIRED if k not in sd]
    if missing:
        raise ValueError(f'weights are incomplete: missing {missing}')
    num_layers = _layer_count(sd)
    dims = sd['cls_token'].shape[-1]
    num_heads, heads_source = resolve_heads(dims, heads_in_weights,
                                            requested_heads)
    proj = sd['patch_embed.projection.weight']
    if proj.dim() != 4 or proj.shape[2] != proj.shape[3]:
        raise ValueError('mmseg\'s VisionTransformer needs a square patch '
                         f'embedding kernel, got {tuple(proj.shape)}')
    hidden = sd['layers.0.ffn.layers.0.0.weight'].shape[0]
    if hidden % dims:
        raise ValueError(f'MLP width {hidden} is not a multiple of '
                         f'embed_dims={dims}: mmseg\'s VisionTransformer '
                         'builds it as mlp_ratio * embed_dims')
    patches = sd['pos_embed'].shape[1] - 1
    side = round(patches**0.5)
    if side * side != patches:
        raise ValueError(f'pos_embed holds {patches} patch positions, not a '
                         'square grid (mmseg resizes pos-embeds as squares)')
    return BackboneSettings(
        embed_dims=dims,
        num_layers=num_layers,
        num_heads=num_heads,
        heads_source=heads_source,
        mlp_ratio=hidden // dims,
        patch_size=proj.shape[2],
        in_channels=proj.shape[1],
        pos_grid=(side, side),
        with_cls_token=with_cls_token,
        final_norm='ln1.weight' in sd,
        pre_norm='ln_pre.weight' in sd,
        patch_bias='patch_embed.projection.bias' in sd,
        qkv_bias='layers.0.attn.attn.in_proj_bias' in sd,
        dwc=_value_branch(sd, num_layers, 'dwc', (dims, 1, 3, 3)),
        gate=_value_branch(sd, num_layers, 'gate_proj', (dims, dims)))
