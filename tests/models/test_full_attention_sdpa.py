"""MiTAViT(full_attention='sdpa') against mmseg's VisionTransformer."""
import pytest
import torch
import torch.nn.functional as F
from mmseg.models.backbones import VisionTransformer

from mmseg_mita.models import MiTAViT

SMALL = dict(img_size=(32, 48), patch_size=8, embed_dims=32, num_layers=3,
             num_heads=2, out_indices=(0, 2))
DROPOUT = dict(attn_drop_rate=0.3, drop_rate=0.1, drop_path_rate=0.2)


def _pair(**kwargs):
    """mmseg's ViT and MiTAViT with the same weights (eval mode)."""
    torch.manual_seed(0)
    vit = VisionTransformer(**SMALL, **DROPOUT)
    vit.init_weights()
    model = MiTAViT(**SMALL, **DROPOUT, **kwargs)
    model.load_state_dict(vit.state_dict(), strict=True)
    vit.eval()
    model.eval()
    return vit, model


@pytest.mark.parametrize('size', [(32, 48), (41, 23), (8, 8)])
def test_sdpa_equals_mmseg_vit(size):
    vit, sdpa = _pair(mita_cfg=None, full_attention='sdpa')
    x = torch.randn(2, 3, *size)
    for want, got in zip(vit(x), sdpa(x)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_sdpa_gradients_equal_mmseg_vit():
    vit, sdpa = _pair(mita_cfg=None, full_attention='sdpa')
    x = torch.randn(2, 3, 32, 40)
    for model in (vit, sdpa):
        sum(o.square().sum() for o in model(x)).backward()
    grads = dict(sdpa.named_parameters())
    for name, param in vit.named_parameters():
        torch.testing.assert_close(grads[name].grad, param.grad, rtol=1e-4,
                                   atol=1e-5)


def test_state_dict_keys_unchanged():
    vit, sdpa = _pair(mita_cfg=None, full_attention='sdpa')
    assert list(sdpa.state_dict()) == list(vit.state_dict())


def test_full_layers_next_to_mita_layers_use_sdpa():
    """With ``mita_cfg.layers`` a subset, the other layers follow
    ``full_attention``; both settings agree."""
    mita = dict(pool_size=2, topk=3, layers=[1])
    _, mmcv_full = _pair(mita_cfg=mita, full_attention='mmcv')
    _, sdpa_full = _pair(mita_cfg=mita, full_attention='sdpa')
    assert [layer.attn.full_attention for layer in sdpa_full.layers] == \
        ['sdpa'] * 3
    x = torch.randn(1, 3, 32, 48)
    for want, got in zip(mmcv_full(x), sdpa_full(x)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_attention_dropout_reaches_sdpa_in_training_only(monkeypatch):
    calls = []
    sdpa = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        calls.append(kwargs.get('dropout_p'))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, 'scaled_dot_product_attention', recording)
    _, model = _pair(mita_cfg=None, full_attention='sdpa')
    x = torch.randn(1, 3, 32, 48)
    model(x)
    assert calls == [0.0] * 3
    calls.clear()
    model.train()
    model(x)
    assert calls == [DROPOUT['attn_drop_rate']] * 3


def test_training_dropout_has_mmcv_statistics():
    """In training, attention dropout, projection dropout and drop path of
    one layer: SDPA and mmcv's attention have the same mean (the eval
    output) and spread over many draws."""
    vit, model = _pair(mita_cfg=None, full_attention='sdpa')
    full, fast = vit.layers[0].attn, model.layers[0].attn
    full.train()
    fast.train()
    torch.manual_seed(1)
    x = torch.randn(1, 17, 32)
    draws = 3000
    with torch.no_grad():
        expected = fast.eval()(x)
        fast.train()
        samples = {
            name: torch.stack([layer(x) for _ in range(draws)])
            for name, layer in (('mmcv', full), ('sdpa', fast))
        }
    for name, s in samples.items():
        z = (s.mean(0) - expected) / (s.std(0) / draws**0.5 + 1e-6)
        assert z.abs().max() < 5, name
    spread = samples['sdpa'].std(0) / samples['mmcv'].std(0)
    assert 0.9 < spread.mean() < 1.1


@pytest.mark.parametrize('value', ['flash', 'SDPA', None, 1])
def test_full_attention_is_validated(value):
    with pytest.raises(ValueError, match=r"full_attention must be one of "
                       r"\('mmcv', 'sdpa'\)"):
        MiTAViT(**SMALL, full_attention=value)
