# Full-attention twin of mita-vit-mini8_upernet_1xb8-1k_demo-96x96.py: a
# small ViT (patch 8, 12 x 12 tokens) + UPerNet trained from scratch on the
# procedural demo data, on CPU, in a few minutes.
_base_ = [
    '../_base_/models/vit_mln_upernet.py', '../_base_/datasets/demo_ade.py',
    '../_base_/default_runtime.py'
]
crop_size = (96, 96)
norm_cfg = dict(type='BN', requires_grad=True)  # SyncBN needs CUDA
dims = 96
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        img_size=crop_size,
        patch_size=8,
        embed_dims=dims,
        num_layers=4,
        num_heads=3,
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.0),
    # patch 8 gives stride 8: scales 2..0.25 make the usual 4/8/16/32 pyramid
    neck=dict(
        in_channels=[dims] * 4, out_channels=dims, scales=[2, 1, 0.5, 0.25]),
    decode_head=dict(
        in_channels=[dims] * 4,
        channels=64,
        num_classes=5,
        norm_cfg=norm_cfg),
    auxiliary_head=dict(
        in_channels=dims, channels=32, num_classes=5, norm_cfg=norm_cfg))

env_cfg = dict(dist_cfg=dict(backend='gloo'))
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999),
                   weight_decay=0.01),
    paramwise_cfg=dict(
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.),
            'norm': dict(decay_mult=0.)
        }))
max_iters = 1000
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0,
         end=50),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=50, end=max_iters,
         by_epoch=False)
]
train_cfg = dict(
    type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(
        type='CheckpointHook', by_epoch=False, interval=max_iters // 2),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
randomness = dict(seed=0)
