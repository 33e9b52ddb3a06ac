"""MiTAViT's dwc / gate options (the authors' MiTA-DeiT additions); their
numeric match with the authors' checkpoints is in
tests/converters/test_mita_deit.py."""
import pytest
import torch
import torch.nn.functional as F
from mmseg.models.backbones import VisionTransformer

from mmseg_mita.models import MiTAViT
from mmseg_mita.models.backbones.value_branch import (SILU_INVERSE_OF_ONE,
                                                      DepthwiseValueConv,
                                                      add_value_branch)

SMALL = dict(img_size=(32, 48), patch_size=8, embed_dims=32, num_layers=3,
             num_heads=2, out_indices=(0, 2))
BRANCH = ['attn.dwc.weight', 'attn.dwc.bias', 'attn.gate_proj.weight',
          'attn.gate_proj.bias']


def test_keys_are_the_vit_keys_plus_the_branch_in_every_layer():
    vit = VisionTransformer(**SMALL).state_dict()
    model = MiTAViT(**SMALL, dwc=True, gate=True).state_dict()
    extra = {f'layers.{i}.{k}' for i in range(3) for k in BRANCH}
    assert set(model) == set(vit) | extra
    for key, value in vit.items():
        assert model[key].shape == value.shape
    assert model['layers.2.attn.dwc.weight'].shape == (32, 1, 3, 3)
    assert model['layers.2.attn.gate_proj.weight'].shape == (32, 32)


def test_built_as_a_no_op_and_initialised_from_scratch_like_mmseg():
    model = MiTAViT(**SMALL, dwc=True, gate=True)
    attn = model.layers[1].attn
    assert not attn.dwc.weight.any() and not attn.dwc.bias.any()
    assert not attn.gate_proj.weight.any()
    assert torch.equal(F.silu(attn.gate_proj.bias), torch.ones(32))
    assert float(F.silu(torch.tensor(SILU_INVERSE_OF_ONE,
                                     dtype=torch.float64))) == \
        pytest.approx(1.0, abs=1e-15)
    torch.manual_seed(0)
    model.init_weights()  # no checkpoint: mmseg's ViT initialisation
    assert 0.01 < float(attn.gate_proj.weight.std()) < 0.03
    assert not attn.gate_proj.bias.any()
    assert attn.dwc.weight.std() > 0.1


def test_no_op_branch_leaves_the_vit_unchanged():
    torch.manual_seed(0)
    vit = VisionTransformer(**SMALL)
    vit.init_weights()
    model = MiTAViT(**SMALL, dwc=True, gate=True, mita_cfg=None)
    model.load_state_dict(vit.state_dict(), strict=False)
    vit.eval()
    model.eval()
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        for a, b in zip(vit(x), model(x)):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize('extra_tokens', [0, 1])
def test_conv_reads_the_patch_values_as_an_image(extra_tokens):
    torch.manual_seed(0)
    b, heads, d, (h, w) = 2, 2, 3, (3, 5)
    n, c = extra_tokens + h * w, heads * d
    dwc = torch.nn.Conv2d(c, c, 3, padding=1, groups=c)
    conv = DepthwiseValueConv(c)
    conv.load_state_dict(dwc.state_dict())
    gate = torch.nn.Linear(c, c)
    out, x, v = torch.randn(b, n, c), torch.randn(b, n, c), torch.randn(
        b, heads, n, d)
    image = torch.stack([v[:, i // d, extra_tokens:, i % d].reshape(b, h, w)
                         for i in range(c)], dim=1)
    added = dwc(image).flatten(2).transpose(1, 2)
    expected = out.clone()
    expected[:, extra_tokens:] += added
    expected = expected * F.silu(gate(x))
    got = add_value_branch(out, x, v, (h, w), extra_tokens, conv, gate)
    torch.testing.assert_close(got, expected)


def test_flags_are_backbone_arguments_only():
    model = MiTAViT(**SMALL, dwc=True, mita_cfg=dict(topk=4))
    assert model.dwc and not model.gate
    assert model.layers[2].attn.dwc is not None
    assert model.layers[2].attn.gate_proj is None
    model = MiTAViT(**SMALL, gate=True, mita_cfg=dict(topk=4))
    model.set_mita(None)  # full attention keeps the branch
    assert model.layers[0].attn.gate_proj is not None
    model.eval()
    assert model(torch.randn(1, 3, 32, 48))[0].shape == (1, 32, 4, 6)
    # one place: mita_cfg does not take them
    with pytest.raises(ValueError, match=r'MiTAViT\(dwc=True, gate=True\)'):
        model.set_mita(dict(dwc=True))


@pytest.mark.parametrize('kwargs,match', [
    (dict(dwc=1), 'dwc must be True or False, got 1'),
    (dict(gate='yes'), 'gate must be True or False'),
])
def test_bad_flags(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MiTAViT(**SMALL, **kwargs)


@pytest.mark.parametrize('mita_cfg', [None, dict(pool_size=2, topk=4)])
def test_training_step_reaches_the_branch(mita_cfg):
    torch.manual_seed(0)
    model = MiTAViT(**SMALL, dwc=True, gate=True, mita_cfg=mita_cfg)
    model.init_weights()
    model.train()
    model(torch.randn(2, 3, 32, 48))[-1].square().mean().backward()
    for layer in model.layers:
        for param in (layer.attn.dwc.weight, layer.attn.gate_proj.weight):
            assert param.grad is not None and param.grad.abs().max() > 0


def test_conv_needs_the_patch_grid():
    model = MiTAViT(**SMALL, dwc=True, mita_cfg=None)
    attn = model.layers[0].attn
    x = torch.randn(1, 1 + 4 * 6, 32)
    with pytest.raises(ValueError, match='needs the patch grid'):
        attn(x)  # called without the grid
    with pytest.raises(ValueError, match=r'of the 24 patch tokens, got '
                       r'\(5, 5\)'):
        attn(x, hw_shape=(5, 5))
