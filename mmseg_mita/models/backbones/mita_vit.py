"""MiTA-ViT: mmseg's VisionTransformer with MiTA attention in chosen layers."""
from typing import Optional, Sequence, Tuple

import torch.nn.functional as F
from mmcv.cnn.bricks.transformer import MultiheadAttention
from mmengine.model import BaseModule
from mmseg.models.backbones import VisionTransformer
from mmseg.registry import MODELS

from mmseg_mita.ops import BACKENDS, mita_attention
from .state_dict_check import check_state_dict_fits

MITA_DEFAULTS = dict(pool_size=7, topk=49, layers='all', backend='auto')
# How full-attention layers compute: mmcv's MultiheadAttention (as mmseg's
# ViT) or F.scaled_dot_product_attention on the same weights.
FULL_ATTENTION = ('mmcv', 'sdpa')


class MiTAMultiheadAttention(MultiheadAttention):
    """mmcv's ``MultiheadAttention`` computing MiTA instead of full attention.

    It owns the very same submodules (``attn.in_proj_*``, ``attn.out_proj``)
    as the module it replaces, so state-dict keys are unchanged. With
    ``mita=None`` it is full attention again, computed by mmcv's forward
    (``full_attention='mmcv'``) or by ``F.scaled_dot_product_attention`` on
    the same weights (``'sdpa'``).
    """

    def __init__(self, full: MultiheadAttention, num_extra_tokens: int,
                 mita: Optional[dict], full_attention: str = 'mmcv'):
        # Adopt ``full``'s modules instead of running mmcv's constructor,
        # which would build (and drop) a new nn.MultiheadAttention per layer.
        BaseModule.__init__(self, full.init_cfg)
        self.embed_dims = full.embed_dims
        self.num_heads = full.num_heads
        self.batch_first = full.batch_first
        self.attn = full.attn
        self.proj_drop = full.proj_drop
        self.dropout_layer = full.dropout_layer
        self.num_extra_tokens = num_extra_tokens
        self.mita = mita
        self.full_attention = full_attention
        self.hw_shape: Optional[Tuple[int, int]] = None

    def forward(self, query, identity=None, **kwargs):
        if self.mita is None and self.full_attention == 'mmcv':
            return super().forward(query, identity=identity, **kwargs)
        if kwargs:
            raise ValueError(
                f'{"MiTA" if self.mita else "SDPA full"} attention is '
                'self-attention without masks or positional inputs; got '
                f'{sorted(kwargs)}')
        x = query if self.batch_first else query.transpose(0, 1)
        b, n, c = x.shape
        mha = self.attn
        qkv = F.linear(x, mha.in_proj_weight, mha.in_proj_bias)
        q, k, v = qkv.view(b, n, 3, self.num_heads,
                           c // self.num_heads).permute(2, 0, 3, 1, 4)
        dropout_p = mha.dropout if self.training else 0.0
        if self.mita is None:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        else:
            out = self._mita_attention(q, k, v, dropout_p)
        out = mha.out_proj(out.transpose(1, 2).reshape(b, n, c))
        if not self.batch_first:
            out = out.transpose(0, 1)
        identity = query if identity is None else identity
        return identity + self.dropout_layer(self.proj_drop(out))

    def _mita_attention(self, q, k, v, dropout_p: float):
        return mita_attention(
            q, k, v, self.hw_shape,
            num_extra_tokens=self.num_extra_tokens,
            pool_size=fit_pool_size(self.mita['pool_size'], self.hw_shape),
            topk=self.mita['topk'],
            backend=self.mita['backend'],
            dropout_p=dropout_p)


def fit_pool_size(pool_size: Tuple[int, int],
                  hw: Tuple[int, int]) -> Tuple[int, int]:
    """The landmark grid for a patch grid ``hw``: at most one landmark per
    patch along each axis (a grid smaller than ``pool_size`` along an axis
    gets fewer landmarks there, so m shrinks)."""
    return tuple(min(p, int(s)) for p, s in zip(pool_size, hw))


def parse_mita_cfg(mita_cfg: Optional[dict], num_layers: int) -> Optional[dict]:
    """Fill defaults and validate; returns None for full attention."""
    if mita_cfg is None:
        return None
    unknown = set(mita_cfg) - set(MITA_DEFAULTS)
    if unknown:
        raise ValueError(f'mita_cfg has unknown keys {sorted(unknown)}; '
                         f'valid keys are {sorted(MITA_DEFAULTS)}')
    cfg = {**MITA_DEFAULTS, **mita_cfg}
    topk = cfg['topk']
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f'mita_cfg.topk must be an int >= 1, got {topk!r}')
    pool = cfg['pool_size']
    pool = (pool, pool) if isinstance(pool, int) else tuple(pool)
    if len(pool) != 2 or not all(isinstance(p, int) and p >= 1 for p in pool):
        raise ValueError('mita_cfg.pool_size must be an int >= 1 or a pair '
                         f'of them, got {cfg["pool_size"]!r}')
    cfg['pool_size'] = pool
    if cfg['backend'] not in BACKENDS:
        raise ValueError(f'mita_cfg.backend must be one of {BACKENDS}, '
                         f'got {cfg["backend"]!r}')
    layers = cfg['layers']
    if layers == 'all':
        layers = list(range(num_layers))
    elif isinstance(layers, int) or not isinstance(layers, Sequence) or \
            not all(isinstance(i, int) for i in layers):
        raise ValueError("mita_cfg.layers must be 'all' or a list of layer "
                         f'indices, got {layers!r}')
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f'mita_cfg.layers {bad} are out of range for a '
                         f'backbone with num_layers={num_layers} '
                         f'(valid: 0..{num_layers - 1})')
    cfg['layers'] = sorted(set(layers))
    return cfg


def check_full_attention(full_attention) -> None:
    if not isinstance(full_attention, str) or \
            full_attention not in FULL_ATTENTION:
        raise ValueError(
            f'full_attention must be one of {FULL_ATTENTION} (mmcv\'s '
            'MultiheadAttention as in mmseg\'s ViT, or '
            f'F.scaled_dot_product_attention), got {full_attention!r}')


@MODELS.register_module()
class MiTAViT(VisionTransformer):
    """Vision Transformer with MiTA attention (arXiv 2602.01219).

    Takes every argument of mmseg's ``VisionTransformer`` plus ``mita_cfg``:

    - ``pool_size`` (int | (ph, pw)): landmark grid, ``m = ph * pw``;
    - ``topk`` (int): keys per routed expert;
    - ``layers``: ``'all'`` or a list of layer indices to use MiTA in; the
      other layers keep full attention;
    - ``backend``: ``'auto'``, ``'torch'`` or ``'flash'``.

    Any input of at least one patch works: where the patch grid is smaller
    than the landmark grid along an axis, that axis gets one landmark per
    patch (e.g. ``pool_size=7`` on a 2 x 128 grid uses 2 x 7 landmarks,
    m = 14); only an input smaller than one patch raises ``ValueError``.

    ``full_attention`` says how the full-attention layers (all of them with
    ``mita_cfg=None``, the others when ``mita_cfg['layers']`` lists a
    subset) compute: ``'mmcv'``, mmcv's ``MultiheadAttention`` exactly as
    mmseg's ViT, or ``'sdpa'``, ``F.scaled_dot_product_attention`` on the
    same ``in_proj``/``out_proj`` weights (same outputs to float tolerance,
    attention dropout included; the N x N weights are never built).

    ``mita_cfg=None, full_attention='mmcv'`` is exactly mmseg's ViT. MiTA
    adds no parameters, so the state dict has mmseg's ViT keys and its
    checkpoints load unchanged; :meth:`set_mita` changes m, k or the layers
    at any time (e.g. for inference).
    """

    def __init__(self, *args, mita_cfg: Optional[dict] = MITA_DEFAULTS,
                 full_attention: str = 'mmcv', **kwargs):
        check_full_attention(full_attention)
        super().__init__(*args, **kwargs)
        num_extra_tokens = 1 if self.with_cls_token else 0
        for layer in self.layers:
            layer.attn = MiTAMultiheadAttention(layer.attn, num_extra_tokens,
                                                None, full_attention)
        self.full_attention = full_attention
        self.patch_embed.register_forward_hook(self._record_patch_grid)
        self.set_mita(mita_cfg)

    def set_mita(self, mita_cfg: Optional[dict]) -> None:
        """Use MiTA with ``mita_cfg`` (see the class docstring), or full
        attention everywhere with ``None``."""
        cfg = parse_mita_cfg(mita_cfg, len(self.layers))
        self.mita_cfg = cfg
        for i, layer in enumerate(self.layers):
            on = cfg is not None and i in cfg['layers']
            layer.attn.mita = {
                key: cfg[key] for key in ('pool_size', 'topk', 'backend')
            } if on else None

    def init_weights(self):
        """mmseg's ViT initialisation; pretrained weights that do not fit
        (another depth or width, missing keys) raise ``ValueError``
        instead of being skipped with a warning."""
        if not (isinstance(self.init_cfg, dict) and self.init_cfg.get('type')
                in ('Pretrained', 'Pretrained_Part')):
            return super().init_weights()

        # Check exactly what mmseg loads: its key selection, pos_embed resized
        def check(state_dict, prefix, *args):
            check_state_dict_fits(self, state_dict,
                                  str(self.init_cfg['checkpoint']))

        handle = self._register_load_state_dict_pre_hook(check)
        try:
            super().init_weights()
        finally:
            handle.remove()

    def forward(self, inputs):
        size = tuple(inputs.shape[-2:])
        if min(size) < self.patch_size:
            raise ValueError(
                f'input image of size {size} is smaller than one patch '
                f'(patch_size={self.patch_size}); resize or pad images to at '
                f'least {self.patch_size} x {self.patch_size} pixels')
        return super().forward(inputs)

    def _record_patch_grid(self, module, inputs, outputs) -> None:
        _, hw_shape = outputs
        for layer in self.layers:
            layer.attn.hw_shape = tuple(hw_shape)
