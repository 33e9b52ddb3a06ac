import importlib

import pytest
import torch
import torch.nn.functional as F
from mmseg.models.backbones import VisionTransformer

from mmseg_mita.models import MiTAViT
from mmseg_mita.models.backbones.mita_vit import MiTALayerConfig
from mmseg_mita.ops import MiTAOptions, mita_attention

SMALL = dict(img_size=(32, 48), patch_size=8, embed_dims=32, num_layers=3,
             num_heads=2, out_indices=(0, 2))


def _vit_pair(**mita_kwargs):
    torch.manual_seed(0)
    vit = VisionTransformer(**SMALL)
    vit.init_weights()
    mita = MiTAViT(**SMALL, **mita_kwargs)
    mita.load_state_dict(vit.state_dict(), strict=True)
    vit.eval()  # mmseg's ViT.train() returns None, so no chaining
    return vit, mita.eval()


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


@pytest.mark.parametrize('with_cls_token', [True, False])
def test_layer_is_mita_applied_by_hand(with_cls_token):
    """A whole encoder layer of the model (eval mode, attention dropout set)
    against MiTA written out from its weights: q, k, v from in_proj on the
    normalised tokens, the (H, W) = (4, 7) grid of a 32 x 56 input, the
    residual from the layer's input, then mmseg's FFN."""
    torch.manual_seed(0)
    model = MiTAViT(**{**SMALL, 'img_size': (32, 56)},
                    with_cls_token=with_cls_token, attn_drop_rate=0.3,
                    mita_cfg=dict(pool_size=(2, 3), topk=5))
    model.init_weights()
    model.eval()
    layer = model.layers[1]
    seen = {}
    layer.register_forward_hook(
        lambda module, args, out: seen.update(x=args[0], out=out))
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 56))

        x = seen['x']
        b, n, c = x.shape
        assert n == int(with_cls_token) + 4 * 7
        mha = layer.attn.attn
        heads = mha.num_heads
        q, k, v = (
            F.linear(layer.ln1(x), w, bias).view(b, n, heads, c // heads)
            .transpose(1, 2) for w, bias in zip(
                mha.in_proj_weight.chunk(3), mha.in_proj_bias.chunk(3)))
        attn = mita_attention(q, k, v, (4, 7),
                              num_extra_tokens=int(with_cls_token),
                              pool_size=(2, 3), topk=5, backend='torch')
        y = x + mha.out_proj(attn.transpose(1, 2).reshape(b, n, c))
        want = layer.ffn(layer.ln2(y), identity=y)
    torch.testing.assert_close(seen['out'], want)


def test_attention_dropout_reaches_the_operator_in_training_only(
        monkeypatch):
    backbone = importlib.import_module('mmseg_mita.models.backbones.mita_vit')
    received = []

    def recording_mita_attention(*args, dropout_p, **kwargs):
        received.append(dropout_p)
        return mita_attention(*args, dropout_p=dropout_p, **kwargs)

    monkeypatch.setattr(backbone, 'mita_attention', recording_mita_attention)
    model = MiTAViT(**SMALL, attn_drop_rate=0.3,
                    mita_cfg=dict(pool_size=2, topk=4))
    x = torch.randn(1, 3, 32, 48)
    model.train()
    model(x)
    assert received == [0.3] * 3
    received.clear()
    model.eval()
    model(x)
    assert received == [0.0] * 3


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
    assert model.mita_layers == (1, )
    model.set_mita(dict(pool_size=3, topk=9))
    want = MiTALayerConfig(MiTAOptions(pool_size=(3, 3), topk=9), 'auto')
    # one options object, validated once, kept by the backbone with the
    # backend name and shared by the layers
    assert model.mita == want and model.mita_layers == (0, 1, 2)
    assert all(layer.attn.mita is model.mita for layer in model.layers)
    model.set_mita(None)
    assert model.mita is None and model.mita_layers == ()
    assert all(layer.attn.mita is None for layer in model.layers)


def test_set_attention_backend_keeps_the_options_and_layers():
    mita_cfg = dict(pool_size=2, topk=4, layers=[0, 2])
    model = MiTAViT(**SMALL, mita_cfg=mita_cfg)
    options = model.mita.options
    model.set_attention_backend('export')
    assert model.mita == MiTALayerConfig(options, 'export')
    assert model.mita.options is options and model.mita_layers == (0, 2)
    assert [layer.attn.mita for layer in model.layers] == [
        model.mita, None, model.mita]
    with pytest.raises(ValueError, match='backend must be one of'):
        model.set_attention_backend('fast')
    model.set_mita(None)
    with pytest.raises(ValueError, match='uses full attention'):
        model.set_attention_backend('torch')


@pytest.mark.parametrize('cfg,match', [
    (dict(pool=7), r"unknown keys \['pool'\]"),
    (dict(dwc=True), 'dwc and gate are arguments of the backbone'),
    (dict(topk=0), 'topk'),
    (dict(pool_size=0), 'pool_size'),
    (dict(layers=[0, 3]), r'layers \[3\] are out of range'),
    (dict(layers=2), 'layers'),
    (dict(backend='cuda'), 'backend'),
])
def test_bad_mita_cfg(cfg, match):
    with pytest.raises(ValueError, match=match):
        MiTAViT(**SMALL, mita_cfg=cfg)


def test_pool_size_larger_than_grid_uses_one_landmark_per_patch():
    """(tests/models/test_any_input_shape.py checks the landmark grid.)"""
    model = MiTAViT(**SMALL, mita_cfg=dict(pool_size=7, topk=4))
    outs = model(torch.randn(1, 3, 32, 48))  # a 4 x 6 grid
    assert [o.shape for o in outs] == [torch.Size([1, 32, 4, 6])] * 2


def test_train_and_eval_return_the_module():
    model = MiTAViT(**SMALL, norm_eval=True)
    assert model.eval() is model and not model.training
    assert model.train() is model and model.training
    # norm_eval keeps mmseg's behaviour: LayerNorms stay in eval mode
    assert not model.layers[0].ln1.training


def test_no_forward_hooks_and_no_state_written_in_forward():
    model = MiTAViT(**SMALL, mita_cfg=dict(pool_size=2, topk=4)).eval()
    modules = list(model.modules())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in modules)
    before = {id(m): dict(vars(m)) for m in modules}
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 48))
    assert {id(m): dict(vars(m)) for m in modules} == before
