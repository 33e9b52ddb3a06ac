"""Google AugReg / vision_transformer and big_vision ``.npz`` -> timm keys.

Flax stores a conv kernel as HWIO, a Dense kernel as [in, out], the q/k/v
kernels as [D, heads, head_dim] (biases [heads, head_dim]) and the attention
output kernel as [heads, head_dim, D]; torch wants OIHW and [out, in]. The
number of heads is therefore stored in the file and read from it.

Two layouts exist:

* AugReg (``github.com/google-research/vision_transformer``): blocks
  ``Transformer/encoderblock_{i}/`` with ``LayerNorm_0``,
  ``MultiHeadDotProductAttention_1``, ``LayerNorm_2``, ``MlpBlock_3``;
  ``cls``; ``Transformer/posembed_input/pos_embedding``;
* big_vision: ``MultiHeadDotProductAttention_0``, ``LayerNorm_1``,
  ``MlpBlock_0``; ``pos_embedding``; often no ``cls``; blocks either per
  index or stacked on a leading depth axis (``Transformer/encoderblock/``).

Keys may sit under ``opt/target/``, ``params/`` or ``params/img/``.
"""
import re
from typing import Dict, List, NamedTuple

import numpy as np
import torch
from torch import Tensor

PREFIXES = ('', 'opt/target/', 'params/', 'params/img/')
ANCHOR = 'embedding/kernel'
CLASSIFIER = ('head/', 'pre_logits/', 'MAPHead_0/')
LAYOUTS = {  # attention, second norm, MLP of a block
    'augreg': ('MultiHeadDotProductAttention_1', 'LayerNorm_2', 'MlpBlock_3'),
    'big_vision': ('MultiHeadDotProductAttention_0', 'LayerNorm_1',
                   'MlpBlock_0'),
}


class TimmWeights(NamedTuple):
    state_dict: Dict[str, Tensor]
    num_heads: int
    notes: List[str]


def npz_prefix(arrays: Dict[str, np.ndarray]) -> str:
    """The key prefix of the ViT weights; ValueError if there are none."""
    for prefix in PREFIXES:
        if prefix + ANCHOR in arrays:
            return prefix
    raise ValueError(
        'this .npz holds no ViT weights: expected a patch embedding '
        f'{ANCHOR!r} (optionally under {PREFIXES[1:]}), found keys '
        f'{sorted(arrays)[:8]}')


def _t(a: np.ndarray) -> Tensor:
    if a.dtype.kind != 'f':
        raise ValueError(f'.npz weights must be floating point, got '
                         f'{a.dtype} (bfloat16 archives: convert to float32 '
                         'first)')
    return torch.from_numpy(np.ascontiguousarray(a))


def _blocks(w: Dict[str, np.ndarray]) -> List[Dict[str, np.ndarray]]:
    """Per-block weights (keys relative to the block), stacked or not."""
    stacked = 'Transformer/encoderblock/'
    if any(k.startswith(stacked) for k in w):
        keys = [k for k in w if k.startswith(stacked)]
        depth = w[stacked + 'LayerNorm_0/scale'].shape[0]
        return [{k[len(stacked):]: w[k][i] for k in keys}
                for i in range(depth)]
    indices = sorted({
        int(m.group(1))
        for m in (re.match(r'Transformer/encoderblock_(\d+)/', k) for k in w)
        if m
    })
    if indices != list(range(len(indices))) or not indices:
        raise ValueError(f'.npz encoder blocks {indices} are not 0..depth-1')
    return [{
        k[len(f'Transformer/encoderblock_{i}/'):]: v
        for k, v in w.items() if k.startswith(f'Transformer/encoderblock_{i}/')
    } for i in indices]


def _convert_block(blk: Dict[str, np.ndarray], i: int,
                   out: Dict[str, Tensor]) -> int:
    layout = next((name for name, (mha, _, _) in LAYOUTS.items()
                   if f'{mha}/query/kernel' in blk), None)
    if layout is None:
        raise ValueError(f'.npz block {i} has no attention weights '
                         f'(keys {sorted(blk)[:6]})')
    mha, ln2, mlp = LAYOUTS[layout]
    p = f'blocks.{i}.'
    used = set()

    def take(key):
        used.add(key)
        return blk[key]

    dims, heads, head_dim = take(f'{mha}/query/kernel').shape
    qkv_w = [take(f'{mha}/{n}/kernel').reshape(dims, -1).T
             for n in ('query', 'key', 'value')]
    qkv_b = [take(f'{mha}/{n}/bias').reshape(-1)
             for n in ('query', 'key', 'value')]
    out[p + 'attn.qkv.weight'] = _t(np.concatenate(qkv_w))
    out[p + 'attn.qkv.bias'] = _t(np.concatenate(qkv_b))
    out[p + 'attn.proj.weight'] = _t(
        take(f'{mha}/out/kernel').reshape(heads * head_dim, dims).T)
    out[p + 'attn.proj.bias'] = _t(take(f'{mha}/out/bias'))
    for src, dst in (('LayerNorm_0', 'norm1'), (ln2, 'norm2')):
        out[p + dst + '.weight'] = _t(take(f'{src}/scale'))
        out[p + dst + '.bias'] = _t(take(f'{src}/bias'))
    for r in range(2):
        out[p + f'mlp.fc{r + 1}.weight'] = _t(
            take(f'{mlp}/Dense_{r}/kernel').T)
        out[p + f'mlp.fc{r + 1}.bias'] = _t(take(f'{mlp}/Dense_{r}/bias'))
    unused = sorted(set(blk) - used)
    if unused:
        raise ValueError(f'.npz block {i} has weights {unused} that a plain '
                         'ViT block does not have')
    return heads


def npz_to_timm(arrays: Dict[str, np.ndarray]) -> TimmWeights:
    """AugReg / big_vision arrays -> timm ViT state dict and head count."""
    prefix = npz_prefix(arrays)
    w = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
    notes = []
    outside = len(arrays) - len(w)
    if outside:
        notes.append(f'ignored {outside} arrays outside {prefix!r} '
                     '(optimizer state)')
    if 'conv_root/kernel' in w:
        raise ValueError('this .npz is a hybrid ResNet+ViT; only plain ViTs '
                         '(patch embedding) can be converted')
    kernel = w['embedding/kernel']
    if kernel.ndim != 4:
        raise ValueError('embedding/kernel must be a conv kernel [ph, pw, '
                         f'in, D], got shape {kernel.shape}')
    out = {'patch_embed.proj.weight': _t(kernel.transpose(3, 2, 0, 1))}
    if 'embedding/bias' in w:
        out['patch_embed.proj.bias'] = _t(w['embedding/bias'])
    pos_key = next((k for k in ('Transformer/posembed_input/pos_embedding',
                                'pos_embedding') if k in w), None)
    if pos_key is None:
        raise ValueError('.npz has no learned position embedding '
                         '(Transformer/posembed_input/pos_embedding or '
                         'pos_embedding)')
    out['pos_embed'] = _t(w[pos_key])
    if 'cls' in w:
        out['cls_token'] = _t(w['cls'])
    out['norm.weight'] = _t(w['Transformer/encoder_norm/scale'])
    out['norm.bias'] = _t(w['Transformer/encoder_norm/bias'])
    heads = {_convert_block(blk, i, out) for i, blk in enumerate(_blocks(w))}
    if len(heads) != 1:
        raise ValueError(f'.npz blocks disagree on the number of heads: '
                         f'{sorted(heads)}')
    known = {'embedding/kernel', 'embedding/bias', pos_key, 'cls',
             'Transformer/encoder_norm/scale', 'Transformer/encoder_norm/bias'}
    rest = [k for k in w
            if k not in known and not k.startswith('Transformer/encoderblock')]
    dropped = [k for k in rest if k.startswith(CLASSIFIER)]
    unknown = sorted(set(rest) - set(dropped))
    if unknown:
        raise ValueError(f'.npz weights {unknown[:8]} have no counterpart in '
                         "mmseg's VisionTransformer")
    if dropped:
        notes.append(f'dropped classification-only weights: {sorted(dropped)}')
    return TimmWeights(out, heads.pop(), notes)
