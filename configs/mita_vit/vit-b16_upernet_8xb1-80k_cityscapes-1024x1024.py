# ViT-B/16 + MultiLevelNeck + UPerNet on Cityscapes (19 classes), full
# attention computed by F.scaled_dot_product_attention (twin of
# mita-vit-b16_upernet_8xb1-80k_cityscapes-1024x1024.py).
# - Training: 1024 x 1024 crops (4097 tokens) of mmseg's
#   cityscapes_1024x1024.py pipeline.
# - Test: whole-image inference at 1024 x 2048 (8193 tokens). Slide
#   inference instead:
#   --cfg-options model.test_cfg.mode=slide
#       'model.test_cfg.crop_size=(1024,1024)'
#       'model.test_cfg.stride=(768,768)'
# - Recipe: mmseg's ViT UPerNet recipe (as the ADE20K UPerNet configs: AdamW
#   lr 6e-5, weight decay 0.01, warm-up 1500 iterations, poly power 1; SyncBN
#   in neck and heads) over 80k iterations with 1 image per GPU x 8 GPUs, the
#   length and batch of mmseg's SETR Cityscapes configs
#   (setr_vit-l_*_8xb1-80k_cityscapes-768x768.py); mmseg's UPerNet ViT
#   recipe exists for ADE20K only. No Cityscapes training was run.
# - Backbone weights: timm's AugReg ViT-B/16 at 384 converted with
#   tools/convert_vit.py to pretrain/vit-b16_augreg-384_mmseg.pth
#   (docs/configs.md).
_base_ = [
    '../_base_/models/vit_mln_upernet.py',
    'mmseg::_base_/datasets/cityscapes_1024x1024.py',
    '../_base_/default_runtime.py',
    '../_base_/schedules/schedule_80k_vit_adamw.py'
]
crop_size = (1024, 1024)
model = dict(
    # timm's AugReg ViTs take inputs scaled to [-1, 1]
    data_preprocessor=dict(size=crop_size, mean=[127.5] * 3, std=[127.5] * 3),
    backbone=dict(
        img_size=crop_size,
        patch_bias=True,
        final_norm=True,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='pretrain/vit-b16_augreg-384_mmseg.pth')),
    decode_head=dict(num_classes=19),
    auxiliary_head=dict(num_classes=19),
    test_cfg=dict(mode='whole'))
train_dataloader = dict(batch_size=1)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
