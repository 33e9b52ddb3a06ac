# mmseg's ViT UPerNet recipe (schedule_160k_vit_adamw.py: AdamW lr 6e-5,
# weight decay 0.01, none on pos_embed, cls_token, norms; 1500 iterations of
# linear warm-up, then poly, power 1) over mmseg's Cityscapes length of 80k
# iterations (schedule_80k.py: validation and checkpoints every 8k).
_base_ = './schedule_160k_vit_adamw.py'
max_iters = 80000
param_scheduler = [
    dict(
        type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0,
        end=1500),
    dict(
        type='PolyLR',
        eta_min=0.0,
        power=1.0,
        begin=1500,
        end=max_iters,
        by_epoch=False)
]
train_cfg = dict(max_iters=max_iters, val_interval=8000)
default_hooks = dict(checkpoint=dict(interval=8000))
