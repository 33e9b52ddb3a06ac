"""The authors' MiTA-DeiT checkpoints (plain, DWC, DWC + gate), converted
and checked against the raw checkpoint.

tests/data/vit/mita_deit_*.pth are written by
tools/make_mita_deit_fixtures.py in the layout of the authors' training
code. The reference below computes the model from the RAW state dict with
plain PyTorch (no module of this project): patch-embedding conv, pos-embed,
pre-norm blocks whose attention is full attention or MiTA as specified per
query by ``mmseg_mita.ops.naive_mita``, the depth-wise value conv, the
SiLU gate, the MLP and the final norm. The converted ``MiTAViT`` must match
it in float64, forward and backward.

Landmarks: the default convention (pooled patch queries) and the
authors' ``landmarks='official'``.
"""
import os.path as osp
import warnings

import pytest
import torch
import torch.nn.functional as F

import mmseg_mita.mmseg_plugin  # noqa: F401  (mmengine's loader)
from mmseg_mita.converters import (convert, convert_file, read_checkpoint,
                                   write_checkpoint)
from mmseg_mita.converters.convert_tool import main as convert_main
from mmseg_mita.models import MiTAViT
from mmseg_mita.ops import naive_mita

DATA = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'data',
                'vit')
HEADS = 3
# fixture -> (dwc, gate)
LAYOUTS = {
    'mita_deit_plain.pth': (False, False),
    'mita_deit_dwc.pth': (True, False),
    'mita_deit_dwc_gate.pth': (True, True),
}
LAYOUTS_FLAGS = {name: dict(dwc=dwc, gate=gate)
                 for name, (dwc, gate) in LAYOUTS.items()}
BRANCH_KEYS = {
    'dwc': 'layers.{0,1}.attn.dwc.weight, layers.{0,1}.attn.dwc.bias',
    'gate': 'layers.{0,1}.attn.gate_proj.weight, '
    'layers.{0,1}.attn.gate_proj.bias',
}
# MiTA settings: (mita_cfg, per layer: None = full attention, or naive_mita
# arguments). The grid is 5 x 5, so N = 26 tokens.
ATTENTION = {
    'full': (None, [None, None]),
    'mita': (dict(pool_size=2, topk=7, backend='torch'),
             [dict(pool_size=2, topk=7)] * 2),
    'mita_k_ge_n_layer1': (
        dict(pool_size=(2, 3), topk=30, layers=[1], backend='torch'),
        [None, dict(pool_size=(2, 3), topk=30)]),
    'mita_official': (
        dict(pool_size=2, topk=7, backend='torch', landmarks='official'),
        [dict(pool_size=2, topk=7, landmarks='official')] * 2),
}


def _raw(name):
    return read_checkpoint(osp.join(DATA, name))['model']


def _layer_norm(x, sd, prefix):
    return F.layer_norm(x, x.shape[-1:], sd[prefix + '.weight'],
                        sd[prefix + '.bias'], eps=1e-6)


def reference_tokens(sd, x, attention):
    """Tokens [B, 1 + H * W, C] (cls first) after block 0 and after the
    last block and the final norm, from the raw timm-named ``sd``;
    ``attention[i]``: None (full) or naive_mita arguments for block i."""
    weight = sd['patch_embed.proj.weight']
    c, p = weight.shape[0], weight.shape[-1]
    t = F.conv2d(x, weight, sd['patch_embed.proj.bias'], stride=p)
    b, _, h, w = t.shape
    t = torch.cat([sd['cls_token'].expand(b, -1, -1),
                   t.flatten(2).transpose(1, 2)], dim=1) + sd['pos_embed']
    n, d = t.shape[1], c // HEADS
    blocks = []
    for i, mita in enumerate(attention):
        pre = f'blocks.{i}.'
        y = _layer_norm(t, sd, pre + 'norm1')
        fused = pre + ('attn.qkvg' if pre + 'attn.qkvg.weight' in sd else
                       'attn.qkv')
        chunks = (y @ sd[fused + '.weight'].T + sd[fused + '.bias']).split(
            c, dim=-1)
        q, k, v = (z.reshape(b, n, HEADS, d).transpose(1, 2)
                   for z in chunks[:3])
        if mita is None:
            attn = torch.softmax(q @ k.transpose(-2, -1) * d**-0.5, dim=-1)
            o = attn @ v
        else:
            o = naive_mita(q, k, v, (h, w), num_extra_tokens=1, **mita)
        o = o.transpose(1, 2).reshape(b, n, c)
        if pre + 'attn.dwc.weight' in sd:
            values = chunks[2][:, 1:].transpose(1, 2).reshape(b, c, h, w)
            conv = F.conv2d(values, sd[pre + 'attn.dwc.weight'],
                            sd[pre + 'attn.dwc.bias'], padding=1, groups=c)
            o = torch.cat([o[:, :1], o[:, 1:] + conv.flatten(2).transpose(
                1, 2)], dim=1)
        if len(chunks) == 4:
            o = o * F.silu(chunks[3])
        t = t + o @ sd[pre + 'attn.proj.weight'].T + sd[pre +
                                                       'attn.proj.bias']
        y = _layer_norm(t, sd, pre + 'norm2')
        y = F.gelu(y @ sd[pre + 'mlp.fc1.weight'].T + sd[pre + 'mlp.fc1.bias'])
        t = t + y @ sd[pre + 'mlp.fc2.weight'].T + sd[pre + 'mlp.fc2.bias']
        blocks.append(t)
    return blocks[0], _layer_norm(t, sd, 'norm')


def _tokens(out):
    feat, cls = out
    return torch.cat([cls[:, None], feat.flatten(2).transpose(1, 2)], dim=1)


def _converted_backbone(name, mita_cfg, **extra):
    conversion = convert_file(osp.join(DATA, name), num_heads=HEADS)
    cfg = conversion.settings.backbone_cfg()
    backbone = MiTAViT(**cfg, **extra, out_indices=(0, 1),
                       output_cls_token=True, mita_cfg=mita_cfg)
    backbone.load_state_dict(conversion.state_dict, strict=True)
    backbone.eval()  # mmseg's train() returns None: no chaining
    return backbone


@pytest.mark.parametrize('name', LAYOUTS)
def test_layout_is_told_from_content(name):
    conversion = convert_file(osp.join(DATA, name), num_heads=HEADS)
    dwc, gate = LAYOUTS[name]
    settings = conversion.settings
    assert conversion.format == 'deit'
    assert (settings.dwc, settings.gate) == (dwc, gate)
    assert (settings.embed_dims, settings.num_layers, settings.mlp_ratio,
            settings.patch_size, settings.pos_grid) == (24, 2, 2, 8, (5, 5))
    notes = ' '.join(conversion.notes)
    assert "model='mita_deit_tiny_" in notes  # the saved training args
    assert ('attn.dwc' in notes) == dwc and ('attn.qkvg' in notes) == gate
    cfg = settings.backbone_cfg()
    assert cfg.get('dwc', False) == dwc and cfg.get('gate', False) == gate


@pytest.mark.parametrize('attention', ATTENTION)
@pytest.mark.parametrize('name', LAYOUTS)
def test_converted_model_reproduces_the_raw_checkpoint(name, attention):
    mita_cfg, per_layer = ATTENTION[attention]
    backbone = _converted_backbone(name, mita_cfg).double()
    sd = {k: v.double() for k, v in _raw(name).items()}
    x = torch.randn(2, 3, 40, 40, generator=torch.Generator().manual_seed(0),
                    dtype=torch.float64)
    with torch.no_grad():
        outs = backbone(x)
        expected = reference_tokens(sd, x, per_layer)
    for out, ref in zip(outs, expected):
        torch.testing.assert_close(_tokens(out), ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize('name', LAYOUTS)
def test_float32_model_matches_float64_reference(name):
    backbone = _converted_backbone(name, None)
    sd = {k: v.double() for k, v in _raw(name).items()}
    x = torch.randn(2, 3, 40, 40, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        outs = backbone(x)
        expected = reference_tokens(sd, x.double(), [None, None])
    for out, ref in zip(outs, expected):
        torch.testing.assert_close(_tokens(out).double(), ref, rtol=0,
                                   atol=1e-5)


@pytest.mark.parametrize('attention',
                         ['full', 'mita', 'mita_official'])
def test_gradients_reach_conv_and_gate_as_in_the_raw_model(attention):
    name = 'mita_deit_dwc_gate.pth'
    mita_cfg, per_layer = ATTENTION[attention]
    backbone = _converted_backbone(name, mita_cfg).double()
    sd = {k: v.double().requires_grad_() for k, v in _raw(name).items()}
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 40, 40, generator=gen, dtype=torch.float64)
    weight = torch.randn(2, 26, 24, generator=gen, dtype=torch.float64)
    (_tokens(backbone(x)[1]) * weight).sum().backward()
    (reference_tokens(sd, x, per_layer)[1] * weight).sum().backward()
    c = 24
    for i, layer in enumerate(backbone.layers):
        attn = layer.attn
        qkvg = sd[f'blocks.{i}.attn.qkvg.weight'].grad
        pairs = [
            (attn.dwc.weight, sd[f'blocks.{i}.attn.dwc.weight'].grad),
            (attn.dwc.bias, sd[f'blocks.{i}.attn.dwc.bias'].grad),
            (attn.gate_proj.weight, qkvg[3 * c:]),
            (attn.gate_proj.bias, sd[f'blocks.{i}.attn.qkvg.bias'].grad[3 *
                                                                        c:]),
            (attn.attn.in_proj_weight, qkvg[:3 * c]),
            (attn.attn.out_proj.weight, sd[f'blocks.{i}.attn.proj.weight']
             .grad),
        ]
        for param, expected in pairs:
            assert param.grad.abs().max() > 0
            torch.testing.assert_close(param.grad, expected, rtol=0,
                                       atol=1e-10)


def _write_converted(tmp_path, name):
    src = osp.join(DATA, name)
    conversion = convert_file(src, num_heads=HEADS)
    dst = str(tmp_path / f'converted_{name}')
    write_checkpoint(conversion, dst, src)
    return conversion, dst


def _pretrained_backbone(dst, conversion, **flags):
    cfg = dict(conversion.settings.backbone_cfg(), dwc=False, gate=False)
    cfg.update(flags)
    return MiTAViT(**cfg, out_indices=(0, 1), output_cls_token=True,
                   mita_cfg=dict(pool_size=2, topk=7),
                   init_cfg=dict(type='Pretrained', checkpoint=dst))


@pytest.mark.parametrize('name', LAYOUTS)
def test_converted_checkpoint_loads_through_init_cfg_silently(tmp_path,
                                                                name):
    conversion, dst = _write_converted(tmp_path, name)
    dwc, gate = LAYOUTS[name]
    backbone = _pretrained_backbone(dst, conversion, dwc=dwc, gate=gate)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        backbone.init_weights()
    assert not [w for w in record if 'initial values' in str(w.message)]
    for key, value in conversion.state_dict.items():
        if key != 'pos_embed':
            assert torch.equal(backbone.state_dict()[key], value), key


@pytest.mark.parametrize('name,flags,fresh', [
    ('mita_deit_plain.pth', dict(dwc=True, gate=True), ('dwc', 'gate')),
    ('mita_deit_plain.pth', dict(dwc=True), ('dwc', )),
    ('mita_deit_dwc.pth', dict(dwc=True, gate=True), ('gate', )),
])
def test_missing_conv_or_gate_is_reported_and_starts_as_a_no_op(
        tmp_path, name, flags, fresh):
    conversion, dst = _write_converted(tmp_path, name)
    backbone = _pretrained_backbone(dst, conversion, **flags)
    with pytest.warns(UserWarning) as record:
        backbone.init_weights()
    ours = [str(w.message) for w in record
            if 'keep their initial values' in str(w.message)]
    assert len(ours) == 1
    listed = ', '.join(BRANCH_KEYS[kind] for kind in fresh)
    assert f'no weights for {4 * len(fresh)} parameters' in ours[0]
    assert f': {listed} keep their initial values' in ours[0]
    # the new branch changes nothing yet: same outputs as the checkpoint's
    # own model
    reference = _pretrained_backbone(dst, conversion, **LAYOUTS_FLAGS[name])
    reference.init_weights()
    backbone.eval()
    reference.eval()
    x = torch.randn(1, 3, 40, 40)
    with torch.no_grad():
        for a, b in zip(backbone(x), reference(x)):
            torch.testing.assert_close(_tokens(a), _tokens(b))


@pytest.mark.parametrize('name,flags,match', [
    ('mita_deit_dwc.pth', dict(), 'build it with dwc=True'),
    ('mita_deit_dwc_gate.pth', dict(dwc=True), 'build it with gate=True'),
    ('mita_deit_dwc_gate.pth', dict(), 'build it with dwc=True and '
     'gate=True'),
])
def test_conv_or_gate_weights_need_a_backbone_with_them(tmp_path, name,
                                                        flags, match):
    conversion, dst = _write_converted(tmp_path, name)
    with pytest.raises(ValueError, match=match):
        _pretrained_backbone(dst, conversion, **flags).init_weights()


def test_other_missing_weights_are_still_refused(tmp_path):
    conversion, _ = _write_converted(tmp_path, 'mita_deit_plain.pth')
    del conversion.state_dict['layers.1.ln2.weight']
    dst = str(tmp_path / 'incomplete.pth')
    torch.save({'state_dict': conversion.state_dict}, dst)
    backbone = _pretrained_backbone(dst, conversion, dwc=True, gate=True)
    with pytest.raises(ValueError, match=r'lacks 1 of .*layers\.1\.ln2'):
        backbone.init_weights()


def _edited(name, edit):
    sd = dict(_raw(name))
    edit(sd)
    return {'model': sd}


@pytest.mark.parametrize('edit,match', [
    (lambda sd: [sd.pop(f'blocks.1.attn.dwc.{k}') for k in ('weight',
                                                            'bias')],
     r'in blocks \[0\] but not in \[1\]'),
    (lambda sd: sd.update({'blocks.0.attn.dwc.weight': torch.zeros(
        24, 1, 5, 5), 'blocks.1.attn.dwc.weight': torch.zeros(24, 1, 5, 5)}),
     r'layers.0.attn.dwc.weight is \(24, 1, 5, 5\); .* needs weight '
     r'\(24, 1, 3, 3\) \(a 3 x 3 depth-wise kernel\)'),
    (lambda sd: sd.update({'blocks.0.attn.qkvg.weight': torch.zeros(95,
                                                                    24)}),
     'has 95 rows'),
    (lambda sd: sd.update({'blocks.0.attn.qkv.weight': torch.zeros(72, 24)}),
     'both attn.qkv and attn.qkvg'),
])
def test_inconsistent_layouts_are_refused(edit, match):
    with pytest.raises(ValueError, match=match):
        convert(_edited('mita_deit_dwc_gate.pth', edit), num_heads=HEADS)


def test_missing_conv_bias_becomes_zero():
    def drop_bias(sd):
        for i in range(2):
            del sd[f'blocks.{i}.attn.dwc.bias']

    conversion = convert(_edited('mita_deit_dwc.pth', drop_bias))
    assert torch.equal(conversion.state_dict['layers.1.attn.dwc.bias'],
                       torch.zeros(24))
    assert 'attn.dwc.bias' in ' '.join(conversion.notes)


def test_mmseg_checkpoint_of_a_variant_backbone_converts_back():
    backbone = _converted_backbone('mita_deit_dwc_gate.pth', None)
    segmentor = {'state_dict': {'backbone.' + k: v
                                for k, v in backbone.state_dict().items()}}
    conversion = convert(segmentor, fmt='mmseg')
    assert conversion.settings.dwc and conversion.settings.gate
    for key, value in backbone.state_dict().items():
        assert torch.equal(conversion.state_dict[key], value)


@pytest.mark.parametrize('name,landmarks', [
    ('mita_deit_plain.pth', 'landmarks: unknown'),
    ('mita_deit_dwc.pth', "landmarks: 'official'"),
    ('mita_deit_dwc_gate.pth', "landmarks: 'official'"),
])
def test_cli_prints_variant_and_mita_settings(tmp_path, capsys, name,
                                              landmarks):
    dwc, gate = LAYOUTS[name]
    convert_main([osp.join(DATA, name), str(tmp_path / 'out.pth'),
                  '--num-heads', '3'])
    out = capsys.readouterr().out
    assert f'dwc:            {dwc}' in out
    assert f'gate:           {gate}' in out
    assert ('dwc=True,' in out) == dwc and ('gate=True,' in out) == gate
    assert landmarks in out
    if dwc or gate:  # the authors' modules hard-code m = k = 25
        assert 'mita_cfg.pool_size=5, mita_cfg.topk=25 run them' in out
    else:
        assert 'pool_size, topk, layers: not stored in weights' in out


def test_kv_topk_is_read_as_a_side_length():
    from argparse import Namespace

    from mmseg_mita.converters.mita_deit import training_args_note
    notes = training_args_note({'args': Namespace(kv_topk=7, lr=1e-3)})
    assert notes[0] == ('training arguments saved in the checkpoint: '
                        'kv_topk=7')
    assert 'use mita_cfg.topk=49 (not 7)' in notes[1]
