"""MiTA-ViT: mmseg's VisionTransformer with MiTA attention in chosen layers.

The layers are :class:`MiTAEncoderLayer`, mmseg's ``TransformerEncoderLayer``
whose ``build_attn`` builds :class:`MiTAMultiheadAttention` (as mmseg's
``MAETransformerEncoderLayer`` overrides it) and whose forward takes the
patch grid as an argument: no hook, nothing written during forward.
"""
import dataclasses
import inspect
import warnings
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmcv.cnn.bricks.transformer import MultiheadAttention
from mmseg.models.backbones import VisionTransformer
from mmseg.models.backbones.vit import TransformerEncoderLayer
from mmseg.registry import MODELS

from mmseg_mita.ops import MiTAOptions, backend_names, mita_attention
from mmseg_mita.ops.options import FIELDS as OPTION_FIELDS
from mmseg_mita.utils import check_choice, check_flag
from .state_dict_check import check_state_dict_fits, describe_keys
from .value_branch import (VALUE_BRANCH_KEY, DepthwiseValueConv,
                           GateProjection, add_value_branch)

# mita_cfg: the fields of MiTAOptions plus where (layers) and how (backend).
LAYER_KEYS = dict(layers='all', backend='auto')
# How full-attention layers compute: mmcv's MultiheadAttention (as mmseg's
# ViT) or F.scaled_dot_product_attention on the same weights.
FULL_ATTENTION = ('mmcv', 'sdpa')


@dataclasses.dataclass(frozen=True)
class MiTALayerConfig:
    """What one MiTA layer computes: ``options`` with ``backend``."""
    options: MiTAOptions
    backend: str = 'auto'


class MiTAMultiheadAttention(MultiheadAttention):
    """mmcv's ``MultiheadAttention`` computing MiTA instead of full attention.

    Built from the same arguments (so the same submodules and state-dict
    keys, ``attn.in_proj_*``, ``attn.out_proj``), plus
    ``num_extra_tokens`` and how it computes: with ``mita=None`` it is full
    attention, computed by mmcv's forward (``full_attention='mmcv'``) or by
    ``F.scaled_dot_product_attention`` on the same weights (``'sdpa'``);
    with a :class:`MiTALayerConfig` it is MiTA. The forward takes the patch
    grid ``hw_shape`` of the tokens.

    ``dwc`` / ``gate`` add the authors' depth-wise value convolution
    (``attn.dwc``) and output gate (``attn.gate_proj``), with MiTA or full
    attention (see :mod:`.value_branch`).
    """

    def __init__(self, *args, num_extra_tokens: int = 1, dwc: bool = False,
                 gate: bool = False, full_attention: str = 'mmcv',
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.num_extra_tokens = num_extra_tokens
        self.full_attention = full_attention
        self.mita: Optional[MiTALayerConfig] = None
        self.dwc = DepthwiseValueConv(self.embed_dims) if dwc else None
        self.gate_proj = GateProjection(self.embed_dims) if gate else None

    def forward(self, query, identity=None, hw_shape=None, **kwargs):
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
            hw_shape = self._patch_grid(hw_shape)
            out = mita_attention(q, k, v, hw_shape,
                                 num_extra_tokens=self.num_extra_tokens,
                                 options=self.mita.options.fitted(hw_shape),
                                 backend=self.mita.backend,
                                 dropout_p=dropout_p)
        out = out.transpose(1, 2).reshape(b, n, c)
        if has_value_branch:
            out = add_value_branch(out, x, v, hw_shape,
                                   self.num_extra_tokens, self.dwc,
                                   self.gate_proj)
        out = mha.out_proj(out)
        if not self.batch_first:
            out = out.transpose(0, 1)
        identity = query if identity is None else identity
        return identity + self.dropout_layer(self.proj_drop(out))

    def _patch_grid(self, hw_shape) -> Tuple[int, int]:
        if hw_shape is None:
            raise ValueError(
                'MiTA attention needs the patch grid of the tokens: call it '
                'with hw_shape=(H, W) (MiTAViT passes its patch grid to '
                'every layer)')
        return tuple(hw_shape)


class MiTAEncoderLayer(TransformerEncoderLayer):
    """mmseg's ViT encoder layer with :class:`MiTAMultiheadAttention`.

    ``attn_cfg`` carries the attention's own arguments (``num_extra_tokens``,
    ``dwc``, ``gate``, ``full_attention``); the forward takes the patch
    grid."""

    def build_attn(self, attn_cfg):
        self.attn = MiTAMultiheadAttention(**attn_cfg)

    def forward(self, x, hw_shape=None):

        def inner_forward(x):
            x = self.attn(self.norm1(x), identity=x, hw_shape=hw_shape)
            return self.ffn(self.norm2(x), identity=x)

        if self.with_cp and x.requires_grad:
            return cp.checkpoint(inner_forward, x, use_reentrant=False)
        return inner_forward(x)


def parse_mita_cfg(mita_cfg: Optional[dict], num_layers: int,
                   num_extra_tokens: int
                   ) -> Optional[Tuple[MiTALayerConfig, Tuple[int, ...]]]:
    """``mita_cfg`` checked, defaults filled: the config of its MiTA layers
    (one :class:`MiTAOptions`, validated once, and the backend) and their
    sorted indices. None for full attention."""
    if mita_cfg is None:
        return None
    if not isinstance(mita_cfg, dict):
        raise ValueError(f'mita_cfg must be a dict or None, got {mita_cfg!r}')
    unknown = sorted(set(mita_cfg) - set(OPTION_FIELDS) - set(LAYER_KEYS))
    if unknown:
        raise ValueError(
            f'mita_cfg has unknown keys {unknown}; valid keys are '
            f'{sorted(OPTION_FIELDS + tuple(LAYER_KEYS))}' +
            ('; dwc and gate are arguments of the backbone (they add '
             'parameters): MiTAViT(dwc=True, gate=True)'
             if {'dwc', 'gate'} & set(unknown) else ''))
    options = MiTAOptions.from_dict(
        {k: v for k, v in mita_cfg.items() if k not in LAYER_KEYS},
        prefix='mita_cfg.')
    if options.landmarks == 'official' and num_extra_tokens != 1:
        raise ValueError(
            "mita_cfg.landmarks='official' pools the first H * W tokens, "
            'which needs exactly one extra (cls) token: build the backbone '
            "with with_cls_token=True, or use landmarks='patches'")
    cfg = {**LAYER_KEYS, **mita_cfg}
    backend = check_choice(cfg['backend'], 'mita_cfg.backend',
                           backend_names())
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
    return MiTALayerConfig(options, backend), tuple(sorted(set(layers)))


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
    - ``backend``: a name of ``mmseg_mita.ops.REGISTRY`` or ``'auto'``
      (``'export'``: standard ONNX operators, inference only, set by
      ``mmseg_mita.deploy.prepare_for_export``, see docs/deploy.md).

    The options are validated once, when the backbone is built (or
    :meth:`set_mita` is called), into one :class:`MiTAOptions`: the
    backbone keeps it with the backend name in ``mita`` (a
    :class:`MiTALayerConfig`, None for full attention), shared by the MiTA
    layers ``mita_layers``; :meth:`set_attention_backend` switches the
    backend alone. Each layer is told the patch grid by the backbone's
    forward.

    Any input of at least one patch works: where the patch grid is smaller
    than the landmark grid along an axis, that axis gets one landmark per
    patch (e.g. ``pool_size=7`` on a 2 x 128 grid uses 2 x 7 landmarks,
    m = 14) and ``experts_per_query`` is at most that m
    (:meth:`MiTAOptions.fitted`); only an input smaller than one patch
    raises ``ValueError``.

    ``full_attention`` says how the full-attention layers (all of them with
    ``mita_cfg=None``, the others when ``mita_cfg['layers']`` lists a
    subset) compute: ``'mmcv'``, mmcv's ``MultiheadAttention`` exactly as
    mmseg's ViT, or ``'sdpa'``, ``F.scaled_dot_product_attention`` on the
    same ``in_proj``/``out_proj`` weights (same outputs to float tolerance,
    attention dropout included; the N x N weights are never built).

    ``mita_cfg=None, full_attention='mmcv'`` (without dwc, gate) is exactly
    mmseg's ViT. MiTA adds no parameters, so the state dict has mmseg's ViT
    keys and its checkpoints load unchanged; :meth:`set_mita` changes m, k
    or the layers at any time (e.g. for inference), and
    :meth:`set_attention_backend` the backend.

    ``dwc=True`` / ``gate=True`` (arguments of the backbone only: they add
    parameters, so they are part of its structure) add the authors'
    MiTA-DeiT depth-wise value convolution / output gate to EVERY layer (as
    their code does; MiTA or full attention alike; :mod:`.value_branch`),
    with keys ``layers.{i}.attn.dwc.*`` / ``layers.{i}.attn.gate_proj.*``
    beside the unchanged ViT keys. A checkpoint without them loads with a
    warning that lists the parameters that keep their initial values (which
    make the branch a no-op); a checkpoint with them does not load into a
    backbone without.
    """

    def __init__(self, *args, mita_cfg: Optional[dict] = LAYER_KEYS,
                 dwc: bool = False, gate: bool = False,
                 full_attention: str = 'mmcv', **kwargs):
        check_choice(full_attention, 'full_attention', FULL_ATTENTION)
        bound = inspect.signature(VisionTransformer.__init__).bind(
            None, *args, **kwargs)
        bound.apply_defaults()
        vit = dict(bound.arguments)  # every argument of mmseg's ViT
        del vit['self']
        # mmseg's ViT without layers, then the layers it would build, with
        # MiTA-capable attention (same arguments, same order of random
        # draws, same state-dict keys).
        super().__init__(**{**vit, 'num_layers': 0})
        num_layers = vit['num_layers']
        if vit['out_indices'] == -1:
            self.out_indices = [num_layers - 1]
        self.dwc = check_flag(dwc, 'dwc')
        self.gate = check_flag(gate, 'gate')
        self.full_attention = full_attention
        attn_cfg = dict(num_extra_tokens=1 if self.with_cls_token else 0,
                        dwc=self.dwc, gate=self.gate,
                        full_attention=full_attention)
        rates = torch.linspace(0, vit['drop_path_rate'], num_layers)
        for rate in rates.tolist():
            self.layers.append(
                MiTAEncoderLayer(
                    embed_dims=vit['embed_dims'],
                    num_heads=vit['num_heads'],
                    feedforward_channels=vit['mlp_ratio'] *
                    vit['embed_dims'],
                    attn_drop_rate=vit['attn_drop_rate'],
                    drop_rate=vit['drop_rate'],
                    drop_path_rate=rate,
                    num_fcs=vit['num_fcs'],
                    qkv_bias=vit['qkv_bias'],
                    act_cfg=vit['act_cfg'],
                    norm_cfg=vit['norm_cfg'],
                    with_cp=vit['with_cp'],
                    batch_first=True,
                    attn_cfg=dict(attn_cfg)))
        self._freeze()
        self.set_mita(mita_cfg)

    def set_mita(self, mita_cfg: Optional[dict]) -> None:
        """Use MiTA with ``mita_cfg`` (see the class docstring), or full
        attention everywhere with ``None``. ``dwc`` and ``gate`` stay as
        built."""
        parsed = parse_mita_cfg(mita_cfg, len(self.layers),
                                1 if self.with_cls_token else 0)
        self._use_mita(*(parsed or (None, ())))

    def set_attention_backend(self, backend: str) -> None:
        """Compute the MiTA layers with ``backend`` (a name of
        ``mmseg_mita.ops.backend_names()``), the options unchanged (e.g.
        ``'export'`` for ONNX export, as
        ``mmseg_mita.deploy.prepare_for_export`` does)."""
        check_choice(backend, 'backend', backend_names())
        if self.mita is None:
            raise ValueError(
                f'backend={backend!r} has no MiTA layer to compute: this '
                'backbone uses full attention (mita_cfg=None); call '
                'set_mita(dict(...)) first')
        self._use_mita(dataclasses.replace(self.mita, backend=backend),
                       self.mita_layers)

    def _use_mita(self, mita: Optional[MiTALayerConfig],
                  layers: Tuple[int, ...]) -> None:
        """``mita`` in the layers ``layers``, full attention elsewhere."""
        self.mita, self.mita_layers = mita, layers
        for i, layer in enumerate(self.layers):
            layer.attn.mita = mita if i in layers else None

    def train(self, mode: bool = True) -> 'MiTAViT':
        """mmseg's ViT ``train`` (``norm_eval`` included), returning the
        module as ``nn.Module.train`` does (mmseg's returns None)."""
        super().train(mode)
        return self

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
        """mmseg's ViT forward, with the patch grid handed to every layer."""
        size = tuple(inputs.shape[-2:])
        if min(size) < self.patch_size:
            raise ValueError(
                f'input image of size {size} is smaller than one patch '
                f'(patch_size={self.patch_size}); resize or pad images to at '
                f'least {self.patch_size} x {self.patch_size} pixels')
        x, hw_shape = self.patch_embed(inputs)
        cls_tokens = self.cls_token.expand(x.shape[0], -1, -1)
        x = self._pos_embeding(torch.cat((cls_tokens, x), dim=1), hw_shape,
                               self.pos_embed)
        if not self.with_cls_token:
            x = x[:, 1:]
        if self.pre_norm:
            x = self.pre_ln(x)
        outs = [self._feature_map(x, hw_shape)] if self.out_origin else []
        for i, layer in enumerate(self.layers):
            x = layer(x, hw_shape)
            if i == len(self.layers) - 1 and self.final_norm:
                x = self.norm1(x)
            if i in self.out_indices:
                outs.append(self._feature_map(x, hw_shape))
        return tuple(outs)

    def _feature_map(self, x, hw_shape):
        """Tokens [B, N, C] -> the patches as [B, C, H, W] (with the cls
        token, ``[map, cls]`` when ``output_cls_token``)."""
        out = x[:, 1:] if self.with_cls_token else x
        b, _, c = out.shape
        out = out.reshape(b, hw_shape[0], hw_shape[1],
                          c).permute(0, 3, 1, 2).contiguous()
        return [out, x[:, 0]] if self.output_cls_token else out
