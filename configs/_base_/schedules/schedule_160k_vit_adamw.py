# mmseg's ViT UPerNet recipe: AdamW lr 6e-5, weight decay 0.01 (none on
# pos_embed, cls_token, norms), 1500 iterations of linear warm-up, then
# poly (power 1) to the end of training: PolyLR has no `end`, so mmengine's
# Runner ends it at train_cfg.max_iters (160k here; schedules of another
# length set max_iters only).
_base_ = 'mmseg::_base_/schedules/schedule_160k.py'
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(
        type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.),
            'norm': dict(decay_mult=0.)
        }))
param_scheduler = [
    dict(
        type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0,
        end=1500),
    dict(
        type='PolyLR',
        eta_min=0.0,
        power=1.0,
        begin=1500,
        by_epoch=False)
]
