"""The converter, proved numerically on real-format checkpoints.

tests/data/vit holds tiny timm ViTs saved as each format saves them and the
timm models' own tokens on a fixed input (written by
tools/make_timm_fixtures.py with real timm; see its docstring). Each is
converted, loaded with no missing or unexpected key, and must reproduce the
source model's tokens.
"""
import os
import os.path as osp
import struct
import zipfile

import numpy as np
import pytest
import torch
from mmseg.models.backbones import VisionTransformer

import mmseg_mita.mmseg_plugin  # noqa: F401  (mmengine's loader)
from helpers import flip_bit_in_tensor
from mmseg_mita.converters import (convert, convert_file, read_checkpoint,
                                   write_checkpoint)
from mmseg_mita.converters.convert_tool import main as convert_main
from mmseg_mita.converters.settings import resolve_heads
from mmseg_mita.models import MiTAViT

DATA = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'data',
                'vit')
# file, detected format, source model in features.pth
CASES = [
    ('vit_timm.pth', 'timm', 'vit'),
    ('vit_timm.safetensors', 'timm', 'vit'),
    ('vit_augreg.npz', 'augreg', 'vit'),
    ('vit_mmpretrain.pth', 'mmpretrain', 'vit'),
    ('deit3_deit.pth', 'deit', 'deit3'),
    ('gap_bigvision.npz', 'augreg', 'gap'),
]
HEADS = 3


@pytest.fixture(scope='module')
def features():
    return torch.load(osp.join(DATA, 'features.pth'), weights_only=True)


def _tokens(out, with_cls):
    """mmseg backbone output -> [B, L, D] tokens (cls first)."""
    if not with_cls:
        return out.flatten(2).transpose(1, 2)
    feat, cls = out
    return torch.cat([cls[:, None], feat.flatten(2).transpose(1, 2)], dim=1)


def _check_tokens(backbone, with_cls, feats):
    backbone.eval()  # mmseg's train() returns None: no chaining
    with torch.no_grad():
        outs = backbone(feats['input'])
    for out, expected in zip(outs, (feats['blocks'][0], feats['final'])):
        torch.testing.assert_close(_tokens(out, with_cls), expected,
                                   rtol=0, atol=1e-5)


def _convert_to_file(tmp_path, name):
    src = osp.join(DATA, name)
    conversion = convert_file(src, num_heads=HEADS)
    dst = str(tmp_path / 'converted.pth')
    write_checkpoint(conversion, dst, src)
    return conversion, dst


@pytest.mark.parametrize('name,fmt,model', CASES)
def test_converted_mita_vit_reproduces_source_features(
        tmp_path, features, name, fmt, model):
    conversion, dst = _convert_to_file(tmp_path, name)
    assert conversion.format == fmt
    cfg = conversion.settings.backbone_cfg()
    with_cls = cfg['with_cls_token']
    assert with_cls == (features[model]['num_prefix_tokens'] == 1)
    backbone = MiTAViT(**cfg, out_indices=(0, 1), output_cls_token=with_cls,
                       mita_cfg=None)
    state_dict = torch.load(dst, weights_only=True)['state_dict']
    backbone.load_state_dict(state_dict, strict=True)
    _check_tokens(backbone, with_cls, features[model])


@pytest.mark.parametrize('name,fmt,model', CASES[:1] + CASES[4:])
@pytest.mark.parametrize('backbone_type', [VisionTransformer, MiTAViT])
def test_backbones_load_it_through_init_cfg(tmp_path, features, name, fmt,
                                            model, backbone_type):
    # the users' path: init_cfg=Pretrained, loaded by the backbone itself
    conversion, dst = _convert_to_file(tmp_path, name)
    cfg = conversion.settings.backbone_cfg()
    with_cls = cfg['with_cls_token']
    extra = dict(mita_cfg=None) if backbone_type is MiTAViT else {}
    backbone = backbone_type(
        **cfg, **extra, out_indices=(0, 1), output_cls_token=with_cls,
        init_cfg=dict(type='Pretrained', checkpoint=dst))
    backbone.init_weights()
    expected = torch.load(dst, weights_only=True)['state_dict']
    assert backbone.state_dict().keys() == expected.keys()
    _check_tokens(backbone, with_cls, features[model])


def test_mmseg_resizes_pos_embed_for_another_input_size(tmp_path):
    conversion, dst = _convert_to_file(tmp_path, 'vit_augreg.npz')
    cfg = dict(conversion.settings.backbone_cfg(), img_size=(24, 24))
    backbone = VisionTransformer(
        **cfg, init_cfg=dict(type='Pretrained', checkpoint=dst))
    backbone.init_weights()
    expected = VisionTransformer.resize_pos_embed(
        conversion.state_dict['pos_embed'], (6, 6), (4, 4), 'bicubic')
    torch.testing.assert_close(backbone.pos_embed.data, expected)


def test_reported_settings(features):
    vit = convert_file(osp.join(DATA, 'vit_augreg.npz')).settings
    assert (vit.embed_dims, vit.num_layers, vit.mlp_ratio, vit.patch_size,
            vit.pos_grid) == (24, 2, 2, 4, (4, 4))
    assert vit.num_heads == 3 and vit.heads_source == 'from the weights'
    assert vit.final_norm and vit.with_cls_token and not vit.pre_norm
    deit3 = convert_file(osp.join(DATA, 'deit3_deit.pth')).settings
    assert deit3.pre_norm and deit3.num_heads is None
    assert 'pass --num-heads' in deit3.heads_source
    assert not convert_file(osp.join(DATA,
                                     'gap_bigvision.npz')).settings \
        .with_cls_token


def test_heads_from_table_flag_or_weights():
    assert resolve_heads(768, None, None)[0] == 12  # ViT-B
    assert resolve_heads(1024, None, None)[0] == 16  # ViT-L
    assert resolve_heads(24, None, None)[0] is None
    assert resolve_heads(24, None, 3) == (3, '--num-heads')
    npz = read_checkpoint(osp.join(DATA, 'vit_augreg.npz'))
    with pytest.raises(ValueError, match='contradicts the 3 heads'):
        convert(npz, num_heads=2)
    with pytest.raises(ValueError, match='must divide'):
        convert(read_checkpoint(osp.join(DATA, 'vit_timm.pth')), num_heads=5)


def test_mmseg_segmentor_checkpoint_gives_its_backbone(tmp_path, repo_root):
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.runner import save_checkpoint
    from mmseg.registry import MODELS
    cfg = Config.fromfile(osp.join(
        repo_root, 'configs/mita_vit/vit-mini8_upernet_1xb8-1k_demo-96x96.py'))
    init_default_scope('mmseg')
    torch.manual_seed(0)
    segmentor = MODELS.build(cfg.model)
    segmentor.init_weights()
    src = str(tmp_path / 'segmentor.pth')
    save_checkpoint(
        {'meta': {'iter': 1}, 'state_dict': segmentor.state_dict()}, src)
    conversion = convert_file(src, fmt='mmseg')
    assert conversion.format == 'mmseg'
    assert 'decode_head' in ' '.join(conversion.notes)
    settings = conversion.settings
    assert (settings.embed_dims, settings.num_layers, settings.patch_size,
            settings.pos_grid) == (96, 4, 8, (12, 12))
    assert not settings.patch_bias and not settings.final_norm
    backbone_cfg = dict(cfg.model.backbone, type='MiTAViT', mita_cfg=None)
    backbone = MODELS.build(backbone_cfg)
    backbone.load_state_dict(conversion.state_dict, strict=True)
    backbone.eval()
    segmentor.eval()
    x = torch.randn(1, 3, 96, 96)
    with torch.no_grad():
        for a, b in zip(backbone(x), segmentor.backbone(x)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def _timm_state_dict():
    return read_checkpoint(osp.join(DATA, 'vit_timm.pth'))


@pytest.mark.parametrize('content,match', [
    ([1, 2], 'must hold a dict of weights'),
    ({'epoch': 3, 'optimizer': {}}, 'no ViT weights recognised'),
    ({'state_dict': {'backbone.conv1.weight': torch.zeros(1)}},
     'no ViT weights recognised'),
])
def test_unknown_content_names_what_was_expected(content, match):
    with pytest.raises(ValueError, match=match) as err:
        convert(content)
    assert 'timm state dict' in str(err.value)
    assert 'mmseg checkpoint' in str(err.value)


def test_inconsistent_and_mismatched_formats_are_refused():
    sd = _timm_state_dict()
    both = dict(sd, state_dict={'backbone.' + k.replace('blocks.', 'layers.')
                                .replace('attn.qkv.', 'attn.attn.in_proj_'):
                                v for k, v in sd.items()})
    with pytest.raises(ValueError, match='inconsistent checkpoint'):
        convert(both)
    with pytest.raises(ValueError, match='--format mmpretrain expects'):
        convert(sd, fmt='mmpretrain')
    with pytest.raises(ValueError, match='expected a NumPy .npz'):
        convert({'a': torch.zeros(1)}, fmt='augreg')
    with pytest.raises(ValueError, match='format must be auto or one of'):
        convert(sd, fmt='jax')


@pytest.mark.parametrize('extra,match', [
    ('reg_token', 'register tokens'),
    ('dist_token', 'distillation token'),
    ('blocks.0.attn.q_norm.weight', 'qk-norm'),
])
def test_weights_without_mmseg_counterpart_are_refused(extra, match):
    sd = dict(_timm_state_dict(), **{extra: torch.zeros(1, 1, 24)})
    with pytest.raises(ValueError, match=match):
        convert(sd)


def test_foreign_file_is_refused(tmp_path):
    path = tmp_path / 'notes.pth'
    path.write_text('not a checkpoint')
    with pytest.raises(ValueError, match="starts with neither a zip archive, "
                       "a safetensors header nor torch's legacy magic number "
                       r'and protocol.*or is no checkpoint: PyTorch files '
                       r'\(\.pth/\.pt/\.bin\), safetensors and NumPy \.npz '
                       'are read'):
        read_checkpoint(str(path))


def test_bit_flipped_file_is_refused(tmp_path):
    path = tmp_path / 'flipped.pth'
    path.write_bytes(flip_bit_in_tensor(osp.join(DATA, 'vit_timm.pth')))
    with pytest.raises(ValueError, match=r'is corrupt or truncated \(member '
                       r'.*/data/\d+ fails its CRC-32 check\)'):
        read_checkpoint(str(path))


def test_npz_with_damaged_deflate_stream_is_refused(tmp_path):
    # the zip directory intact, 64 bytes in the middle of the compressed
    # data of a member inverted: zlib fails before any CRC is checked
    path = tmp_path / 'damaged.npz'
    np.savez_compressed(path, w=np.random.default_rng(0).integers(
        0, 4, 5000).astype(np.uint8))
    with zipfile.ZipFile(path) as archive:
        member = archive.getinfo('w.npy')
    assert member.compress_type == zipfile.ZIP_DEFLATED
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack_from('<HH', data,
                                             member.header_offset + 26)
    mid = (member.header_offset + 30 + name_len + extra_len +
           member.compress_size // 2)
    data[mid - 32:mid + 32] = bytes(b ^ 0xFF for b in data[mid - 32:mid + 32])
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r'is corrupt or truncated \(error: '
                       'Error -3 while decompressing data'):
        read_checkpoint(str(path))


def test_write_is_atomic_and_keeps_existing_dst(tmp_path, monkeypatch):
    src = osp.join(DATA, 'vit_timm.pth')
    conversion = convert_file(src)
    dst = str(tmp_path / 'out.pth')
    with open(dst, 'w') as f:
        f.write('keep me')
    with pytest.raises(FileExistsError, match='--force'):
        write_checkpoint(conversion, dst, src)
    assert open(dst).read() == 'keep me'

    def broken_save(obj, path):
        with open(path, 'w') as f:
            f.write('partial')
        raise OSError('disk full')

    monkeypatch.setattr(torch, 'save', broken_save)
    with pytest.raises(OSError, match='disk full'):
        write_checkpoint(conversion, dst, src, force=True)
    assert open(dst).read() == 'keep me'
    assert os.listdir(tmp_path) == ['out.pth']
    monkeypatch.undo()
    write_checkpoint(conversion, dst, src, force=True)
    assert torch.load(dst, weights_only=True)['meta']['source_format'] == \
        'timm'


def test_cli_prints_settings_and_config(tmp_path, capsys):
    dst = str(tmp_path / 'vit.pth')
    convert_main([osp.join(DATA, 'vit_augreg.npz'), dst])
    out = capsys.readouterr().out
    assert 'augreg checkpoint' in out
    assert 'num_heads:      3 (from the weights)' in out
    assert 'pos-embed grid: 4 x 4' in out
    assert "type='MiTAViT'" in out and 'patch_bias=True' in out
    with pytest.raises(SystemExit, match='exists; pass --force'):
        convert_main([osp.join(DATA, 'vit_augreg.npz'), dst])
