"""Write the source checkpoints that tests/converters check the converter on.

Needs real timm, which needs torchvision, which cannot sit beside the CPU
torch of the project's venv; run it once in a separate venv and commit the
output::

    python3.11 -m venv /work/timm-venv
    /work/timm-venv/bin/pip install torch torchvision timm safetensors
    /work/timm-venv/bin/python tools/make_timm_fixtures.py tests/data/vit

Three tiny timm ``VisionTransformer`` s (16 x 16 input, patch 4, embed 24,
3 heads, depth 2, MLP ratio 2, 10 classes) get random weights (biases,
norms and tokens too, so that no mapping error hides behind a zero or a
one). No weights are downloaded. Each is saved the way its format saves it:

* ``vit``: standard ViT (cls token, pos-embed over cls + patches):
  ``vit_timm.pth`` (timm's state dict), ``vit_timm.safetensors``,
  ``vit_augreg.npz`` (Google AugReg / vision_transformer layout) and
  ``vit_mmpretrain.pth`` (an mmpretrain ``ImageClassifier`` checkpoint:
  ``{'meta', 'state_dict'}`` with ``backbone.`` / ``head.`` keys).
* ``deit3``: DeiT-III-style options (pos-embed without the cls entry,
  layer scale, no qkv bias) plus a pre-norm (and so no patch bias), as a DeiT
  checkpoint ``{'model': state_dict}``: ``deit3_deit.pth``.
* ``gap``: no cls token, average pooling, saved as big_vision ``.npz``
  (``params/`` prefix, blocks stacked on a leading depth axis):
  ``gap_bigvision.npz``.

Every ``.npz`` is checked by loading it with timm's own npz loader into a
fresh timm model and comparing all weights with the source. Where mmpretrain
is importable (``pip install mmcv-lite==2.1.0 mmengine`` and
``pip install --no-deps mmpretrain`` plus its light dependencies), the
mmpretrain file is checked too: it must load strictly into mmpretrain's
``VisionTransformer`` and ``VisionTransformerClsHead`` and reproduce the
timm model's features. ``features.pth``
holds, per model, the fixed input ``[2, 3, 16, 16]`` and the source model's
tokens on it (prefix tokens first, ``[B, L, D]``): ``blocks`` is the output
of every block (before the final norm) and ``final`` that of
``forward_features`` (after the final norm).
"""
import argparse
import os
import os.path as osp

import numpy as np
import torch
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer, _load_weights

TINY = dict(img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=3,
            mlp_ratio=2, num_classes=10)
MODELS = {
    'vit': dict(),
    'deit3': dict(no_embed_class=True, init_values=0.1, qkv_bias=False,
                  pre_norm=True),
    'gap': dict(class_token=False, global_pool='avg', fc_norm=False),
}


def build(name, seed):
    torch.manual_seed(seed)
    model = VisionTransformer(**TINY, **MODELS[name]).eval()
    with torch.no_grad():
        for key, param in model.named_parameters():
            if param.dim() >= 2 and key not in ('cls_token', 'pos_embed'):
                fan_in = param[0].numel()
                param.normal_(0, fan_in**-0.5)
            elif key.endswith('.weight') and 'norm' in key:
                param.normal_(1, 0.2)
            else:  # biases, tokens, layer scale
                param.normal_(0, 0.3)
    return model


@torch.no_grad()
def features(model, x):
    blocks = []
    hooks = [b.register_forward_hook(lambda m, i, o: blocks.append(o))
             for b in model.blocks]
    final = model.forward_features(x)
    for hook in hooks:
        hook.remove()
    return dict(input=x, blocks=torch.stack(blocks), final=final,
                num_prefix_tokens=model.num_prefix_tokens)


def dense(w):
    """torch Linear weight [out, in] -> flax Dense kernel [in, out]."""
    return w.T.numpy()


def to_npz_arrays(sd, num_heads, big_vision):
    """timm state dict -> AugReg (or big_vision) npz arrays.

    Flax layout: conv kernel HWIO, Dense kernel [in, out], attention kernels
    q/k/v [D, heads, head_dim], out [heads, head_dim, D]."""
    prefix = 'params/' if big_vision else ''
    mha, ln2, mlp = (('MultiHeadDotProductAttention_0', 'LayerNorm_1',
                      'MlpBlock_0') if big_vision else
                     ('MultiHeadDotProductAttention_1', 'LayerNorm_2',
                      'MlpBlock_3'))
    d = sd['pos_embed'].shape[-1]
    hd = d // num_heads
    out = {
        'embedding/kernel': sd['patch_embed.proj.weight'].permute(
            2, 3, 1, 0).numpy(),
        'embedding/bias': sd['patch_embed.proj.bias'].numpy(),
        'Transformer/encoder_norm/scale': sd['norm.weight'].numpy(),
        'Transformer/encoder_norm/bias': sd['norm.bias'].numpy(),
        'head/kernel': dense(sd['head.weight']),
        'head/bias': sd['head.bias'].numpy(),
    }
    if big_vision:
        out['pos_embedding'] = sd['pos_embed'].numpy()
    else:
        out['Transformer/posembed_input/pos_embedding'] = \
            sd['pos_embed'].numpy()
    if 'cls_token' in sd:
        out['cls'] = sd['cls_token'].numpy()
    depth = 1 + max(
        int(k.split('.')[1]) for k in sd if k.startswith('blocks.'))
    blocks = []
    for i in range(depth):
        p = f'blocks.{i}.'
        q, k, v = sd[p + 'attn.qkv.weight'].chunk(3)
        qb, kb, vb = sd[p + 'attn.qkv.bias'].chunk(3)
        blk = {
            'LayerNorm_0/scale': sd[p + 'norm1.weight'].numpy(),
            'LayerNorm_0/bias': sd[p + 'norm1.bias'].numpy(),
            f'{ln2}/scale': sd[p + 'norm2.weight'].numpy(),
            f'{ln2}/bias': sd[p + 'norm2.bias'].numpy(),
            f'{mha}/out/kernel': sd[p + 'attn.proj.weight'].T.reshape(
                num_heads, hd, d).numpy(),
            f'{mha}/out/bias': sd[p + 'attn.proj.bias'].numpy(),
            f'{mlp}/Dense_0/kernel': dense(sd[p + 'mlp.fc1.weight']),
            f'{mlp}/Dense_0/bias': sd[p + 'mlp.fc1.bias'].numpy(),
            f'{mlp}/Dense_1/kernel': dense(sd[p + 'mlp.fc2.weight']),
            f'{mlp}/Dense_1/bias': sd[p + 'mlp.fc2.bias'].numpy(),
        }
        for name, w, b in (('query', q, qb), ('key', k, kb), ('value', v, vb)):
            blk[f'{mha}/{name}/kernel'] = w.T.reshape(d, num_heads,
                                                       hd).numpy()
            blk[f'{mha}/{name}/bias'] = b.reshape(num_heads, hd).numpy()
        blocks.append(blk)
    if big_vision:  # scanned layers: one array per weight, depth first
        for key in blocks[0]:
            out[f'Transformer/encoderblock/{key}'] = np.stack(
                [blk[key] for blk in blocks])
    else:
        for i, blk in enumerate(blocks):
            for key, value in blk.items():
                out[f'Transformer/encoderblock_{i}/{key}'] = value
    return {prefix + k: np.ascontiguousarray(v) for k, v in out.items()}


def to_mmpretrain(sd):
    """timm state dict -> mmpretrain ImageClassifier checkpoint (ViT backbone
    + VisionTransformerClsHead) with mmpretrain's key names."""
    top = {'patch_embed.proj.': 'patch_embed.projection.', 'norm.': 'ln1.',
           'cls_token': 'cls_token', 'pos_embed': 'pos_embed'}
    block = {'norm1.': 'ln1.', 'norm2.': 'ln2.', 'attn.qkv.': 'attn.qkv.',
             'attn.proj.': 'attn.proj.', 'mlp.fc1.': 'ffn.layers.0.0.',
             'mlp.fc2.': 'ffn.layers.1.'}
    out = {}
    for key, value in sd.items():
        if key.startswith('head.'):
            out['head.layers.head.' + key[len('head.'):]] = value
            continue
        if key.startswith('blocks.'):
            _, i, rest = key.split('.', 2)
            old = next(o for o in block if rest.startswith(o))
            new = f'layers.{i}.' + block[old] + rest[len(old):]
        else:
            old = next(o for o in top if key.startswith(o))
            new = top[old] + key[len(old):]
        out['backbone.' + new] = value
    return {'meta': {'mmpretrain_version': '1.2.0'}, 'state_dict': out}


def check_npz(name, path, source):
    """Load ``path`` with timm's own npz loader and compare every weight."""
    target = VisionTransformer(**TINY, **MODELS[name])
    with torch.no_grad():
        for param in target.parameters():
            param.zero_()
    _load_weights(target, path)
    for key, value in source.state_dict().items():
        torch.testing.assert_close(target.state_dict()[key], value,
                                   rtol=0, atol=0, msg=f'{path}: {key}')


def check_mmpretrain(path, feats):
    """Load ``path`` into mmpretrain's own modules and compare features."""
    try:
        from mmpretrain.models.backbones import VisionTransformer as MMPViT
        from mmpretrain.models.heads import VisionTransformerClsHead
    except ImportError:
        print('mmpretrain is not importable: mmpretrain file not checked')
        return
    arch = dict(embed_dims=TINY['embed_dim'], num_layers=TINY['depth'],
                num_heads=TINY['num_heads'],
                feedforward_channels=TINY['mlp_ratio'] * TINY['embed_dim'])
    backbone = MMPViT(arch=arch, img_size=TINY['img_size'],
                      patch_size=TINY['patch_size'], out_type='featmap',
                      out_indices=(0, 1))
    backbone.eval()  # mmpretrain's train() returns None: no chaining
    head = VisionTransformerClsHead(num_classes=TINY['num_classes'],
                                    in_channels=TINY['embed_dim'])
    sd = torch.load(path, weights_only=True)['state_dict']
    for prefix, module in (('backbone.', backbone), ('head.', head)):
        module.load_state_dict({
            k[len(prefix):]: v
            for k, v in sd.items() if k.startswith(prefix)
        }, strict=True)
    with torch.no_grad():
        outs = backbone(feats['input'])
    expected = (feats['blocks'][0], feats['final'])
    for out, tokens in zip(outs, expected):
        torch.testing.assert_close(out.flatten(2).transpose(1, 2),
                                   tokens[:, 1:], rtol=0, atol=1e-6)
    print(f'{path}: mmpretrain reproduces the timm features')


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('out', help='output folder, e.g. tests/data/vit')
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    x = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 16, 16, generator=x)
    feats = {}
    for seed, name in enumerate(MODELS):
        model = build(name, seed)
        sd = {k: v.contiguous() for k, v in model.state_dict().items()}
        feats[name] = features(model, x)
        out = lambda f: osp.join(args.out, f)  # noqa: E731
        if name == 'vit':
            torch.save(sd, out('vit_timm.pth'))
            save_file(sd, out('vit_timm.safetensors'))
            np.savez(out('vit_augreg.npz'),
                     **to_npz_arrays(sd, TINY['num_heads'], False))
            check_npz(name, out('vit_augreg.npz'), model)
            torch.save(to_mmpretrain(sd), out('vit_mmpretrain.pth'))
            check_mmpretrain(out('vit_mmpretrain.pth'), feats[name])
        elif name == 'deit3':
            torch.save({'model': sd}, out('deit3_deit.pth'))
        else:
            np.savez(out('gap_bigvision.npz'),
                     **to_npz_arrays(sd, TINY['num_heads'], True))
            check_npz(name, out('gap_bigvision.npz'), model)
    torch.save(feats, osp.join(args.out, 'features.pth'))
    for f in sorted(os.listdir(args.out)):
        print(f'{osp.getsize(osp.join(args.out, f)):8d}  {f}')


if __name__ == '__main__':
    main()
