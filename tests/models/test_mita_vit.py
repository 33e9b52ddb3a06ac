import pytest
import torch
from mmseg.models.backbones import VisionTransformer

from mmseg_mita.models import MiTAViT
from mmseg_mita.ops import mita_attention

SMALL = dict(img_size=(32, 48), patch_size=8, embed_dims=32, num_layers=3,
             num_heads=2, out_indices=(0, 2))


def _vit_pair(**mita_kwargs):
    torch.manual_seed(0)
    vit = VisionTransformer(**SMALL)
    vit.init_weights()
    mita = MiTAViT(**SMALL, **mita_kwargs)
    mita.load_state_dict(vit.state_dict(), strict=True)
    vit.eval()  # mmseg's ViT.train() returns None, so no chaining
    mita.eval()
    return vit, mita


def test_state_dict_keys_are_mmseg_vit_keys():
    vit, mita = _vit_pair(mita_cfg=dict(pool_size=2, topk=4))
    assert list(mita.state_dict()) == list(vit.state_dict())
    for key, value in vit.state_dict().items():
        assert mita.state_dict()[key].shape == value.shape


def test_full_attention_is_identical_to_mmseg_vit():
    vit, mita = _vit_pair(mita_cfg=None)
    x = torch.randn(2, 3, 40, 56)
    for a, b in zip(vit(x), mita(x)):
        assert torch.equal(a, b)


def test_mita_layer_computes_mita_attention():
    _, model = _vit_pair(mita_cfg=dict(pool_size=(2, 3), topk=5))
    layer = model.layers[0]
    x = torch.randn(2, 1 + 4 * 6, 32)
    layer.attn.hw_shape = (4, 6)
    got = layer.attn(x, identity=x)

    mha = layer.attn.attn
    qkv = torch.nn.functional.linear(x, mha.in_proj_weight, mha.in_proj_bias)
    q, k, v = qkv.view(2, 25, 3, 2, 16).permute(2, 0, 3, 1, 4)
    ref = mita_attention(q, k, v, (4, 6), pool_size=(2, 3), topk=5,
                         backend='torch')
    ref = mha.out_proj(ref.transpose(1, 2).reshape(2, 25, 32))
    torch.testing.assert_close(got, x + ref)


@pytest.mark.parametrize('size', [(32, 48), (72, 40), (57, 90), (16, 16)])
def test_any_input_size_and_aspect_ratio(size):
    _, model = _vit_pair(mita_cfg=dict(pool_size=2, topk=4))
    outs = model(torch.randn(1, 3, *size))
    h, w = -(-size[0] // 8), -(-size[1] // 8)  # corner padding to patches
    assert [o.shape for o in outs] == [torch.Size([1, 32, h, w])] * 2


def test_mita_changes_outputs_and_backward_runs():
    vit, mita = _vit_pair(mita_cfg=dict(pool_size=2, topk=3))
    x = torch.randn(2, 3, 32, 48)
    assert not torch.allclose(vit(x)[-1], mita(x)[-1])
    mita.train()
    mita(x)[-1].sum().backward()
    grads = [p.grad for p in mita.parameters() if p.requires_grad]
    assert all(g is not None for g in grads)


def test_layers_and_set_mita():
    model = MiTAViT(**SMALL, mita_cfg=dict(pool_size=2, topk=4, layers=[1]))
    assert [layer.attn.mita is not None for layer in model.layers] == \
        [False, True, False]
    model.set_mita(dict(pool_size=3, topk=9))
    assert all(layer.attn.mita == dict(pool_size=(3, 3), topk=9,
                                       backend='auto')
               for layer in model.layers)
    model.set_mita(None)
    assert all(layer.attn.mita is None for layer in model.layers)


@pytest.mark.parametrize('cfg,match', [
    (dict(pool=7), r"unknown keys \['pool'\]"),
    (dict(topk=0), 'topk'),
    (dict(pool_size=0), 'pool_size'),
    (dict(layers=[0, 3]), r'layers \[3\] are out of range'),
    (dict(layers=2), 'layers'),
    (dict(backend='triton'), 'backend'),
])
def test_bad_mita_cfg(cfg, match):
    with pytest.raises(ValueError, match=match):
        MiTAViT(**SMALL, mita_cfg=cfg)


def test_pool_size_larger_than_grid_uses_one_landmark_per_patch():
    """(tests/models/test_any_input_shape.py checks the landmark grid.)"""
    model = MiTAViT(**SMALL, mita_cfg=dict(pool_size=7, topk=4))
    outs = model(torch.randn(1, 3, 32, 48))  # a 4 x 6 grid
    assert [o.shape for o in outs] == [torch.Size([1, 32, 4, 6])] * 2
