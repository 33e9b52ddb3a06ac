"""Write tiny checkpoints in the layouts of the authors' MiTA-DeiT training
code, which tests/converters/test_mita_deit.py converts and checks.

Needs PyTorch only (no timm, no network); deterministic::

    python tools/make_mita_deit_fixtures.py tests/data/vit

The authors train with DeiT's code: a timm ``VisionTransformer`` whose
attention may carry a 3 x 3 depth-wise convolution of the values
(``attn.dwc``: ``Conv2d(C, C, 3, padding=1, groups=C)``) and a gate fused
into the input projection (``attn.qkvg``: ``Linear(C, 4C)``, chunks q, k, v,
g, instead of ``attn.qkv``), saved as ``{'model': state_dict, 'epoch',
'args': argparse.Namespace}``. The state dicts are written key by key in
that layout; the shapes are those of timm's modules (``Linear`` weight
[out, in], ``Conv2d`` [out, in / groups, kh, kw]). Three files, one per
layout:

* ``mita_deit_plain.pth``: timm ViT keys only;
* ``mita_deit_dwc.pth``: plus ``blocks.{i}.attn.dwc.weight`` / ``.bias``;
* ``mita_deit_dwc_gate.pth``: plus the DWC, ``attn.qkvg`` for ``attn.qkv``.

Tiny model: 40 x 40 input, patch 8 (a 5 x 5 grid), embed 24, 3 heads,
depth 2, MLP ratio 2, cls token, final norm, a 10-class head. Every weight
is random (norms around 1, biases, tokens and the gate too), so that no
mapping error hides behind a zero or a one.
"""
import argparse
import os
import os.path as osp

import torch

TINY = dict(img_size=40, patch_size=8, embed_dim=24, depth=2, num_heads=3,
            mlp_ratio=2, num_classes=10)
LAYOUTS = {  # file name -> (dwc, gate, seed)
    'mita_deit_plain.pth': (False, False, 0),
    'mita_deit_dwc.pth': (True, False, 1),
    'mita_deit_dwc_gate.pth': (True, True, 2),
}


def make_state_dict(dwc: bool, gate: bool, seed: int) -> dict:
    """A timm-named state dict with the authors' additions."""
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape, mean=0.0, std=0.3):
        return torch.randn(*shape, generator=gen) * std + mean

    def linear(out_features, in_features):
        return normal(out_features, in_features, std=in_features**-0.5)

    c, p = TINY['embed_dim'], TINY['patch_size']
    hidden = c * TINY['mlp_ratio']
    grid = TINY['img_size'] // p
    sd = {
        'cls_token': normal(1, 1, c),
        'pos_embed': normal(1, 1 + grid * grid, c),
        'patch_embed.proj.weight': normal(c, 3, p, p, std=(3 * p * p)**-0.5),
        'patch_embed.proj.bias': normal(c),
    }
    for i in range(TINY['depth']):
        b = f'blocks.{i}.'
        sd[b + 'norm1.weight'] = normal(c, mean=1.0, std=0.2)
        sd[b + 'norm1.bias'] = normal(c)
        fused, rows = ('attn.qkvg', 4 * c) if gate else ('attn.qkv', 3 * c)
        sd[b + fused + '.weight'] = linear(rows, c)
        sd[b + fused + '.bias'] = normal(rows)
        if dwc:
            sd[b + 'attn.dwc.weight'] = normal(c, 1, 3, 3, std=1 / 3)
            sd[b + 'attn.dwc.bias'] = normal(c)
        sd[b + 'attn.proj.weight'] = linear(c, c)
        sd[b + 'attn.proj.bias'] = normal(c)
        sd[b + 'norm2.weight'] = normal(c, mean=1.0, std=0.2)
        sd[b + 'norm2.bias'] = normal(c)
        sd[b + 'mlp.fc1.weight'] = linear(hidden, c)
        sd[b + 'mlp.fc1.bias'] = normal(hidden)
        sd[b + 'mlp.fc2.weight'] = linear(c, hidden)
        sd[b + 'mlp.fc2.bias'] = normal(c)
    sd['norm.weight'] = normal(c, mean=1.0, std=0.2)
    sd['norm.bias'] = normal(c)
    sd['head.weight'] = linear(TINY['num_classes'], c)
    sd['head.bias'] = normal(TINY['num_classes'])
    return sd


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('out_dir', help='where to write the checkpoints')
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    for name, (dwc, gate, seed) in LAYOUTS.items():
        train_args = argparse.Namespace(
            model=f'mita_deit_tiny_{name[len("mita_deit_"):-4]}',
            input_size=TINY['img_size'], batch_size=8, lr=5e-4, epochs=300)
        checkpoint = dict(model=make_state_dict(dwc, gate, seed), epoch=299,
                          args=train_args)
        path = osp.join(args.out_dir, name)
        torch.save(checkpoint, path)
        print(f'wrote {path} ({osp.getsize(path)} bytes)')


if __name__ == '__main__':
    main()
