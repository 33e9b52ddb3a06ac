"""MiTA-ViT: mmseg's VisionTransformer with MiTA attention in chosen layers."""
from typing import Optional, Sequence, Tuple

import torch.nn.functional as F
from mmcv.cnn.bricks.transformer import MultiheadAttention
from mmengine.model import BaseModule
from mmseg.models.backbones import VisionTransformer
from mmseg.registry import MODELS

from mmseg_mita.ops import BACKENDS, check_variant_args, mita_attention
from mmseg_mita.utils import check_choice, check_int, check_int_pair
from .state_dict_check import check_state_dict_fits

# The keys of mita_cfg that go to mita_attention as they are.
OPERATOR_KEYS = ('pool_size', 'topk', 'experts_per_query', 'shared_expert',
                 'routed_experts', 'landmarks', 'backend')
MITA_DEFAULTS = dict(pool_size=7, topk=49, experts_per_query=1,
                     shared_expert=True, routed_experts=True,
                     landmarks='patches', layers='all', backend='auto')


class MiTAMultiheadAttention(MultiheadAttention):
    """mmcv's ``MultiheadAttention`` computing MiTA instead of full attention.

    It owns the very same submodules (``attn.in_proj_*``, ``attn.out_proj``)
    as the module it replaces, so state-dict keys are unchanged. With
    ``mita=None`` it is plain full attention again.
    """

    def __init__(self, full: MultiheadAttention, num_extra_tokens: int,
                 mita: Optional[dict]):
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
        self.hw_shape: Optional[Tuple[int, int]] = None

    def forward(self, query, identity=None, **kwargs):
        if self.mita is None:
            return super().forward(query, identity=identity, **kwargs)
        if kwargs:
            raise ValueError('MiTA attention is self-attention without masks '
                             f'or positional inputs; got {sorted(kwargs)}')
        x = query if self.batch_first else query.transpose(0, 1)
        b, n, c = x.shape
        mha = self.attn
        qkv = F.linear(x, mha.in_proj_weight, mha.in_proj_bias)
        q, k, v = qkv.view(b, n, 3, self.num_heads,
                           c // self.num_heads).permute(2, 0, 3, 1, 4)
        out = mita_attention(
            q, k, v, self.hw_shape,
            num_extra_tokens=self.num_extra_tokens,
            dropout_p=mha.dropout if self.training else 0.0,
            **self.mita)
        out = mha.out_proj(out.transpose(1, 2).reshape(b, n, c))
        if not self.batch_first:
            out = out.transpose(0, 1)
        identity = query if identity is None else identity
        return identity + self.dropout_layer(self.proj_drop(out))


def parse_mita_cfg(mita_cfg: Optional[dict], num_layers: int,
                   num_extra_tokens: int) -> Optional[dict]:
    """Fill defaults and validate; returns None for full attention."""
    if mita_cfg is None:
        return None
    unknown = set(mita_cfg) - set(MITA_DEFAULTS)
    if unknown:
        raise ValueError(f'mita_cfg has unknown keys {sorted(unknown)}; '
                         f'valid keys are {sorted(MITA_DEFAULTS)}')
    cfg = {**MITA_DEFAULTS, **mita_cfg}
    check_int(cfg['topk'], 'mita_cfg.topk')
    cfg['pool_size'] = check_int_pair(cfg['pool_size'], 'mita_cfg.pool_size')
    check_variant_args(cfg['experts_per_query'], cfg['shared_expert'],
                       cfg['routed_experts'], cfg['landmarks'],
                       num_extra_tokens,
                       cfg['pool_size'][0] * cfg['pool_size'][1],
                       prefix='mita_cfg.')
    check_choice(cfg['backend'], 'mita_cfg.backend', BACKENDS)
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


@MODELS.register_module()
class MiTAViT(VisionTransformer):
    """Vision Transformer with MiTA attention (arXiv 2602.01219).

    Takes every argument of mmseg's ``VisionTransformer`` plus ``mita_cfg``:

    - ``pool_size`` (int | (ph, pw)): landmark grid, ``m = ph * pw``;
    - ``topk`` (int): keys per routed expert;
    - ``experts_per_query`` (int, 1), ``shared_expert`` (bool, True),
      ``routed_experts`` (bool, True), ``landmarks`` (``'patches'`` or
      ``'official'``, which needs the cls token): the paper's variants, as
      in :func:`mmseg_mita.ops.mita_attention`;
    - ``layers``: ``'all'`` or a list of layer indices to use MiTA in; the
      other layers keep full attention;
    - ``backend``: ``'auto'``, ``'torch'``, ``'flash'``, ``'triton'`` or
      ``'export'`` (standard ONNX operators, inference only: set by
      ``mmseg_mita.deploy.prepare_for_export``, see docs/deploy.md).

    ``mita_cfg=None`` is exactly mmseg's ViT. MiTA adds no parameters, so
    the state dict has mmseg's ViT keys and its checkpoints load unchanged;
    :meth:`set_mita` changes m, k or the layers at any time (e.g. for
    inference).
    """

    def __init__(self, *args, mita_cfg: Optional[dict] = MITA_DEFAULTS,
                 **kwargs):
        super().__init__(*args, **kwargs)
        num_extra_tokens = 1 if self.with_cls_token else 0
        for layer in self.layers:
            layer.attn = MiTAMultiheadAttention(layer.attn, num_extra_tokens,
                                                None)
        self.patch_embed.register_forward_hook(self._record_patch_grid)
        self.set_mita(mita_cfg)

    def set_mita(self, mita_cfg: Optional[dict]) -> None:
        """Use MiTA with ``mita_cfg`` (see the class docstring), or full
        attention everywhere with ``None``."""
        cfg = parse_mita_cfg(mita_cfg, len(self.layers),
                             1 if self.with_cls_token else 0)
        self.mita_cfg = cfg
        for i, layer in enumerate(self.layers):
            on = cfg is not None and i in cfg['layers']
            layer.attn.mita = {key: cfg[key]
                               for key in OPERATOR_KEYS} if on else None

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
