"""MiTA-ViT: mmseg's VisionTransformer with MiTA attention in chosen layers."""
import warnings
from typing import Optional, Sequence, Tuple

import torch.nn.functional as F
from mmcv.cnn.bricks.transformer import MultiheadAttention
from mmengine.model import BaseModule
from mmseg.models.backbones import VisionTransformer
from mmseg.registry import MODELS

from mmseg_mita.ops import BACKENDS, check_variant_args, mita_attention
from mmseg_mita.utils import check_choice, check_int, check_int_pair
from .state_dict_check import check_state_dict_fits, describe_keys
from .value_branch import (VALUE_BRANCH_KEY, DepthwiseValueConv,
                           GateProjection, add_value_branch)

# The keys of mita_cfg that go to mita_attention as they are.
OPERATOR_KEYS = ('pool_size', 'topk', 'experts_per_query', 'shared_expert',
                 'routed_experts', 'landmarks', 'backend')
MITA_DEFAULTS = dict(pool_size=7, topk=49, experts_per_query=1,
                     shared_expert=True, routed_experts=True,
                     landmarks='patches', layers='all', backend='auto',
                     dwc=False, gate=False)


def check_flag(value, name: str) -> bool:
    """A bool (not 0 or 1)."""
    if not isinstance(value, bool):
        raise ValueError(f'{name} must be True or False, got {value!r}')
    return value
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

    ``dwc`` / ``gate`` add the authors' depth-wise value convolution
    (``attn.dwc``) and output gate (``attn.gate_proj``), with MiTA or full
    attention (see :mod:`.value_branch`).
    """

    def __init__(self, full: MultiheadAttention, num_extra_tokens: int,
                 mita: Optional[dict], dwc: bool = False,
                 gate: bool = False, full_attention: str = 'mmcv'):
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
        self.dwc = DepthwiseValueConv(self.embed_dims) if dwc else None
        self.gate_proj = GateProjection(self.embed_dims) if gate else None

    def forward(self, query, identity=None, **kwargs):
        has_value_branch = self.dwc is not None or self.gate_proj is not None
        if (self.mita is None and not has_value_branch
                and self.full_attention == 'mmcv'):
            return super().forward(query, identity=identity, **kwargs)
        if kwargs:
            raise ValueError('MiTA / SDPA attention (and the dwc / gate branch) is '
                             'self-attention without masks or positional '
                             f'inputs; got {sorted(kwargs)}')
        x = query if self.batch_first else query.transpose(0, 1)
        b, n, c = x.shape
        mha = self.attn
        qkv = F.linear(x, mha.in_proj_weight, mha.in_proj_bias)
        q, k, v = qkv.view(b, n, 3, self.num_heads,
                           c // self.num_heads).permute(2, 0, 3, 1, 4)
        dropout_p = mha.dropout if self.training else 0.0
        if self.mita is None:  # full attention: SDPA
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        else:
            out = self._mita_attention(q, k, v, dropout_p)
        out = out.transpose(1, 2).reshape(b, n, c)
        if has_value_branch:
            out = add_value_branch(out, x, v, self.hw_shape,
                                   self.num_extra_tokens, self.dwc,
                                   self.gate_proj)
        out = mha.out_proj(out)
        if not self.batch_first:
            out = out.transpose(0, 1)
        identity = query if identity is None else identity
        return identity + self.dropout_layer(self.proj_drop(out))

    def _mita_attention(self, q, k, v, dropout_p: float):
        pool = fit_pool_size(self.mita['pool_size'], self.hw_shape)
        options = dict(self.mita, pool_size=pool)
        options['experts_per_query'] = min(options['experts_per_query'],
                                           pool[0] * pool[1])
        return mita_attention(q, k, v, self.hw_shape,
                              num_extra_tokens=self.num_extra_tokens,
                              dropout_p=dropout_p, **options)


def fit_pool_size(pool_size: Tuple[int, int],
                  hw: Tuple[int, int]) -> Tuple[int, int]:
    """The landmark grid for a patch grid ``hw``: at most one landmark per
    patch along each axis (a grid smaller than ``pool_size`` along an axis
    gets fewer landmarks there, so m shrinks)."""
    return tuple(min(p, int(s)) for p, s in zip(pool_size, hw))


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
    check_flag(cfg['dwc'], 'mita_cfg.dwc')
    check_flag(cfg['gate'], 'mita_cfg.gate')
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
    - ``experts_per_query`` (int, 1), ``shared_expert`` (bool, True),
      ``routed_experts`` (bool, True), ``landmarks`` (``'patches'`` or
      ``'official'``, which needs the cls token): the paper's variants, as
      in :func:`mmseg_mita.ops.mita_attention`;
    - ``layers``: ``'all'`` or a list of layer indices to use MiTA in; the
      other layers keep full attention;
    - ``backend``: ``'auto'``, ``'torch'``, ``'flash'``, ``'triton'`` or
      ``'export'`` (standard ONNX operators, inference only: set by
      ``mmseg_mita.deploy.prepare_for_export``, see docs/deploy.md).
    - ``dwc``, ``gate``: as the arguments below (``True`` there is the same
      as ``True`` here; ``False`` asks for nothing).

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

    ``mita_cfg=None, full_attention='mmcv'`` (without dwc, gate) is exactly
    mmseg's ViT. MiTA adds
    no parameters, so the state dict has mmseg's ViT keys and its
    checkpoints load unchanged; :meth:`set_mita` changes m, k or the layers
    at any time (e.g. for inference).

    ``dwc=True`` / ``gate=True`` add the authors' MiTA-DeiT depth-wise value
    convolution / output gate to EVERY layer (as their code does; MiTA or
    full attention alike; :mod:`.value_branch`), with keys
    ``layers.{i}.attn.dwc.*`` / ``layers.{i}.attn.gate_proj.*`` beside the
    unchanged ViT keys. They are part of the model's structure, fixed when
    it is built. A checkpoint without them loads with a warning that lists
    the parameters that keep their initial values (which make the branch a
    no-op); a checkpoint with them does not load into a backbone without.
    """

    def __init__(self, *args, mita_cfg: Optional[dict] = MITA_DEFAULTS,
                 dwc: bool = False, gate: bool = False,
                 full_attention: str = 'mmcv', **kwargs):
        check_full_attention(full_attention)
        super().__init__(*args, **kwargs)
        # mita_cfg's flags are checked by set_mita below
        asked = mita_cfg if isinstance(mita_cfg, dict) else {}
        self.dwc = check_flag(dwc, 'dwc') or asked.get('dwc') is True
        self.gate = check_flag(gate, 'gate') or asked.get('gate') is True
        num_extra_tokens = 1 if self.with_cls_token else 0
        for layer in self.layers:
            layer.attn = MiTAMultiheadAttention(layer.attn, num_extra_tokens,
                                                None, self.dwc, self.gate,
                                                full_attention)
        self.full_attention = full_attention
        self.patch_embed.register_forward_hook(self._record_patch_grid)
        self.set_mita(mita_cfg)

    def set_mita(self, mita_cfg: Optional[dict]) -> None:
        """Use MiTA with ``mita_cfg`` (see the class docstring), or full
        attention everywhere with ``None``. ``dwc`` and ``gate`` stay as
        built."""
        cfg = parse_mita_cfg(mita_cfg, len(self.layers),
                             1 if self.with_cls_token else 0)
        if cfg is not None:
            for name in ('dwc', 'gate'):
                if cfg[name] and not getattr(self, name):
                    raise ValueError(
                        f'mita_cfg.{name}=True adds parameters, so it is '
                        'chosen when the backbone is built: build it with '
                        f'{name}=True (or mita_cfg.{name}=True) instead of '
                        'switching it on in set_mita')
            cfg.update(dwc=self.dwc, gate=self.gate)
        self.mita_cfg = cfg
        for i, layer in enumerate(self.layers):
            on = cfg is not None and i in cfg['layers']
            layer.attn.mita = {key: cfg[key]
                               for key in OPERATOR_KEYS} if on else None

    def init_weights(self):
        """mmseg's ViT initialisation; pretrained weights that do not fit
        (another depth or width, missing keys, ``dwc``/``gate`` weights the
        backbone lacks) raise ``ValueError`` instead of being skipped with a
        warning. Only ``dwc``/``gate`` parameters may be missing: they keep
        their initial values, with a warning naming each."""
        if not (isinstance(self.init_cfg, dict) and self.init_cfg.get('type')
                in ('Pretrained', 'Pretrained_Part')):
            return super().init_weights()

        # Check exactly what mmseg loads: its key selection, pos_embed resized
        def check(state_dict, prefix, *args):
            self._check_pretrained(state_dict,
                                   str(self.init_cfg['checkpoint']))

        handle = self._register_load_state_dict_pre_hook(check)
        try:
            super().init_weights()
        finally:
            handle.remove()

    def _check_pretrained(self, state_dict, source: str) -> None:
        """``check_state_dict_fits`` that lets the value-branch parameters
        be missing (warned) but refuses them where the backbone has none."""
        own = self.state_dict().keys()
        branch = [key for key in own if VALUE_BRANCH_KEY.fullmatch(key)]
        fresh = check_state_dict_fits(self, state_dict, source,
                                      optional=branch)
        foreign = [key for key in state_dict
                   if VALUE_BRANCH_KEY.fullmatch(key) and key not in own]
        if foreign:
            kinds = sorted({'dwc=True' if '.dwc.' in k else 'gate=True'
                            for k in foreign})
            raise ValueError(
                f'checkpoint {source} has depth-wise value conv / gate '
                f'weights ({describe_keys(foreign)}) that the backbone '
                f'(dwc={self.dwc}, gate={self.gate}) lacks: build it with '
                f'{" and ".join(kinds)} (tools/convert_vit.py prints the '
                'settings of a checkpoint)')
        if fresh:
            warnings.warn(
                f'checkpoint {source} has no weights for {len(fresh)} '
                f'parameters of the backbone (dwc={self.dwc}, '
                f'gate={self.gate}): {describe_keys(fresh)} keep their '
                'initial values (depth-wise value conv 0, gate SiLU(g) = 1), '
                'so the backbone starts as the checkpoint\'s model')

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
