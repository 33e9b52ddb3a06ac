"""MiTAViT's mita_cfg keys for the paper's variants reach the operator."""
import pytest
import torch

from mmseg_mita.models import MiTAViT
from mmseg_mita.ops import mita_attention

SMALL = dict(img_size=(32, 48), patch_size=8, embed_dims=32, num_layers=2,
             num_heads=2)
VARIANTS = [
    dict(experts_per_query=2),
    dict(experts_per_query=3, shared_expert=False),
    dict(routed_experts=False),
    dict(landmarks='official', experts_per_query=2),
]


@pytest.mark.parametrize('variant', VARIANTS)
def test_layer_computes_the_variant(variant):
    torch.manual_seed(0)
    model = MiTAViT(**SMALL, mita_cfg=dict(pool_size=(2, 3), topk=5,
                                           **variant))
    model.eval()  # mmseg's ViT.train() returns None, so no chaining
    layer = model.layers[0]
    x = torch.randn(2, 1 + 4 * 6, 32)
    got = layer.attn(x, identity=x, hw_shape=(4, 6))

    mha = layer.attn.attn
    qkv = torch.nn.functional.linear(x, mha.in_proj_weight, mha.in_proj_bias)
    q, k, v = qkv.view(2, 25, 3, 2, 16).permute(2, 0, 3, 1, 4)
    ref = mita_attention(q, k, v, (4, 6), pool_size=(2, 3), topk=5,
                         backend='torch', **variant)
    ref = mha.out_proj(ref.transpose(1, 2).reshape(2, 25, 32))
    torch.testing.assert_close(got, x + ref)
    # and it differs from the default operator
    default = mita_attention(q, k, v, (4, 6), pool_size=(2, 3), topk=5)
    default = mha.out_proj(default.transpose(1, 2).reshape(2, 25, 32))
    assert not torch.allclose(got, x + default)


@pytest.mark.parametrize('variant', VARIANTS)
def test_training_step_runs(variant):
    model = MiTAViT(**SMALL, mita_cfg=dict(pool_size=2, topk=4, **variant),
                    attn_drop_rate=0.1)
    model.train()
    model(torch.randn(2, 3, 32, 48))[-1].sum().backward()
    assert all(p.grad is not None for p in model.parameters()
               if p.requires_grad)


@pytest.mark.parametrize('cfg,extra,match', [
    (dict(experts_per_query=5, pool_size=2), {},
     'mita_cfg.experts_per_query=5 is more than the m=4'),
    (dict(shared_expert=False, routed_experts=False), {},
     'mita_cfg.shared_expert and mita_cfg.routed_experts'),
    (dict(routed_experts='no'), {}, 'mita_cfg.routed_experts'),
    (dict(landmarks='grid'), {}, 'mita_cfg.landmarks'),
    (dict(landmarks='official'), dict(with_cls_token=False,
                                      output_cls_token=False),
     "mita_cfg.landmarks='official'.*exactly one extra"),
])
def test_bad_variant_cfg(cfg, extra, match):
    with pytest.raises(ValueError, match=match):
        MiTAViT(**SMALL, **extra, mita_cfg=cfg)
