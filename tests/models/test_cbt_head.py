import math

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

from mmseg_mita.models import CBTHead


def _head(**kwargs):
    torch.manual_seed(0)
    args = dict(in_channels=24, num_classes=5, num_heads=2, head_dims=8,
                pool_size=3)
    head = CBTHead(**{**args, **kwargs})
    head.init_weights()
    return head


def reference_cbt_attention(attn, x, hw):
    """Contract-and-broadcast attention, one batch element and one head at
    a time, each softmax written out."""
    b, t, _ = x.shape
    d = attn.head_dims
    w = attn.proj.weight.view(attn.num_heads, d, -1)
    outputs = torch.zeros(b, t, attn.num_heads * d, dtype=x.dtype)
    for i in range(b):
        for h in range(attn.num_heads):
            z = x[i] @ w[h].T  # [T, d]
            grid = z[:hw[0] * hw[1]].T.reshape(1, d, *hw)
            reps = torch.nn.functional.adaptive_avg_pool2d(
                grid, attn.pool_size).reshape(d, -1).T  # [P, d]
            logits = reps @ z.T / math.sqrt(d)
            a = logits.exp() / logits.exp().sum(-1, keepdim=True)
            reps = reps + attn.contract_step[h] * (a @ z)
            logits = reps @ reps.T / math.sqrt(d)
            s = logits.exp() / logits.exp().sum(-1, keepdim=True)
            reps = s @ reps
            outputs[i, :, h * d:(h + 1) * d] = \
                attn.broadcast_step[h] * (a.T @ reps)
    return attn.out_proj(outputs)


def test_attention_matches_reference():
    head = _head().double()
    attn = head.layers[0].attn
    with torch.no_grad():  # steps away from their init, per head
        attn.contract_step.copy_(torch.tensor([0.5, -1.5]))
        attn.broadcast_step.copy_(torch.tensor([2.0, 0.25]))
    x = torch.randn(2, 5 * 7 + 5, 24, dtype=torch.float64)
    torch.testing.assert_close(attn(x, (5, 7)),
                               reference_cbt_attention(attn, x, (5, 7)))


def test_masks_are_normalised_cosine_similarities():
    head = _head().double().eval()
    head.layers = torch.nn.ModuleList()  # the mask stage alone
    feats = torch.randn(2, 24, 4, 6, dtype=torch.float64)
    tokens = torch.cat([feats.flatten(2).transpose(1, 2),
                        head.class_tokens.expand(2, -1, -1)], 1)
    tokens = head.norm(tokens)
    patches, classes = tokens[:, :24], tokens[:, 24:]
    cos = torch.nn.functional.cosine_similarity(
        patches[:, :, None], classes[:, None], dim=-1)  # [B, hw, K]
    ref = head.mask_norm(cos).transpose(1, 2).reshape(2, 5, 4, 6)
    torch.testing.assert_close(head([feats]), ref)


@pytest.mark.parametrize('hw,num_classes,pool_size', [
    ((5, 7), 1, 3), ((13, 9), 150, 10), ((3, 11), 7, (2, 4)), ((1, 1), 2, 10)
])
def test_output_shape_any_grid_and_class_count(hw, num_classes, pool_size):
    head = _head(num_classes=num_classes, pool_size=pool_size)
    out = head([torch.randn(2, 24, *hw)])
    assert out.shape == (2, num_classes, *hw)
    assert torch.isfinite(out).all()


def test_reads_in_index_stage_and_defaults():
    head = CBTHead(in_channels=24, num_classes=3, in_index=0)
    attn = head.layers[0].attn
    assert (len(head.layers), attn.num_heads, attn.head_dims,
            attn.pool_size) == (3, 3, 100, (10, 10))
    assert not hasattr(head, 'conv_seg')
    out = head([torch.randn(1, 24, 6, 6), torch.randn(1, 8, 3, 3)])
    assert out.shape == (1, 3, 6, 6)


def test_gradients_reach_every_parameter():
    head = _head()
    head.train()
    head([torch.randn(2, 24, 5, 7)]).square().sum().backward()
    for name, p in head.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_loss_through_mmseg_machinery():
    from mmseg.structures import SegDataSample
    from mmengine.structures import PixelData
    head = _head()
    samples = []
    for _ in range(2):
        sample = SegDataSample(metainfo=dict(img_shape=(40, 56)))
        sample.gt_sem_seg = PixelData(
            data=torch.randint(0, 5, (1, 40, 56)))
        samples.append(sample)
    losses = head.loss([torch.randn(2, 24, 5, 7)], samples, train_cfg={})
    assert losses['loss_ce'].requires_grad and losses['loss_ce'] > 0
    meta = [dict(img_shape=(40, 56))] * 2
    assert head.predict([torch.randn(2, 24, 5, 7)], meta,
                        test_cfg={}).shape == (2, 5, 40, 56)


@pytest.mark.parametrize('kwargs,match', [
    (dict(num_heads=0), 'num_heads'),
    (dict(head_dims=2.5), 'head_dims'),
    (dict(num_layers=-1), 'num_layers'),
    (dict(pool_size=(3, 0)), 'pool_size'),
    (dict(in_channels=[24, 24]), 'in_channels'),
    (dict(dropout_ratio=0.1), 'dropout_ratio'),
    (dict(num_classes=2, out_channels=1), 'out_channels'),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _head(**kwargs)


def test_trains_on_demo_data(repo_root, demo_data, tmp_path):
    """A few iterations of the demo ViT with a CBT head: the loss falls."""
    cfg = Config.fromfile(
        f'{repo_root}/configs/mita_vit/'
        'mita-vit-mini8_upernet_1xb8-1k_demo-96x96.py')
    dims = cfg.model.backbone.embed_dims
    cfg.model.backbone.out_indices = -1
    cfg.model.backbone.final_norm = True
    cfg.model.pop('neck')
    cfg.model.pop('auxiliary_head')
    cfg.model.decode_head = dict(
        type='CBTHead', in_channels=dims, num_heads=3, head_dims=16,
        pool_size=4, num_classes=5, loss_decode=dict(
            type='CrossEntropyLoss', loss_weight=1.0))
    iters = 15
    cfg.work_dir = str(tmp_path)
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=iters)
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.test_cfg = cfg.test_dataloader = cfg.test_evaluator = None
    cfg.param_scheduler = None
    cfg.optim_wrapper.optimizer.lr = 1e-3
    cfg.default_hooks.checkpoint = None
    cfg.default_hooks.logger.interval = 1
    cfg.default_hooks.pop('visualization')
    cfg.train_dataloader.update(
        batch_size=4, num_workers=0, persistent_workers=False)
    cfg.train_dataloader.dataset.data_root = demo_data
    runner = Runner.from_cfg(cfg)
    losses = []
    runner.register_hook(_LossRecorder(losses))
    runner.train()
    assert len(losses) == iters and all(map(math.isfinite, losses))
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5]), losses


class _LossRecorder(Hook):
    priority = 'LOWEST'

    def __init__(self, losses):
        self.losses = losses

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None):
        self.losses.append(outputs['loss'].item())
