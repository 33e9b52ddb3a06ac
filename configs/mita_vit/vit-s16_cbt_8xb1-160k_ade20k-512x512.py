# ViT-S/16 + CBT on ADE20K 512 x 512, full attention (twin of
# mita-vit-s16_cbt_8xb1-160k_ade20k-512x512.py). CBT's recipe: 8 images in
# total (8 GPUs x 1), SGD lr 1e-3, momentum 0.9, no weight decay, poly
# schedule (power 0.9) over 160k iterations.
# Backbone weights: timm's AugReg ViT-S/16 at 384 converted with
# tools/convert_vit.py to pretrain/vit-s16_augreg-384_mmseg.pth
# (docs/configs.md).
_base_ = [
    '../_base_/models/vit_cbt.py', 'mmseg::_base_/datasets/ade20k.py',
    '../_base_/default_runtime.py', 'mmseg::_base_/schedules/schedule_160k.py'
]
crop_size = (512, 512)
model = dict(
    # timm's AugReg ViTs take inputs scaled to [-1, 1]
    data_preprocessor=dict(size=crop_size, mean=[127.5] * 3, std=[127.5] * 3),
    backbone=dict(
        img_size=crop_size,
        embed_dims=384,
        num_heads=6,
        patch_bias=True,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='pretrain/vit-s16_augreg-384_mmseg.pth')),
    decode_head=dict(in_channels=384))
optim_wrapper = dict(optimizer=dict(lr=1e-3, weight_decay=0.0))
train_dataloader = dict(batch_size=1)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
