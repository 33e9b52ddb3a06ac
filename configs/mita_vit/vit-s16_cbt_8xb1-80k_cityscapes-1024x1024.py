# ViT-S/16 + CBT on Cityscapes (19 classes), full attention computed by
# F.scaled_dot_product_attention (twin of
# mita-vit-s16_cbt_8xb1-80k_cityscapes-1024x1024.py).
# - Training: 1024 x 1024 crops (64 x 64 patches + cls = 4097 tokens) of
#   mmseg's cityscapes_1024x1024.py pipeline (random resize of 2048 x 1024 by
#   0.5-2, crop, flip, photometric distortion).
# - Test: whole-image inference at 1024 x 2048 (64 x 128 patches + cls =
#   8193 tokens). Slide inference instead:
#   --cfg-options model.test_cfg.mode=slide
#       'model.test_cfg.crop_size=(1024,1024)'
#       'model.test_cfg.stride=(768,768)'
# - Recipe: CBT's, as in the ADE20K CBT configs (SGD lr 1e-3, momentum 0.9,
#   no weight decay, poly power 0.9 to lr 1e-4, 8 GPUs x 1 image), over
#   mmseg's Cityscapes schedule (schedule_80k.py: 80k iterations, the length
#   and 8 x 1 batch of mmseg's SETR Cityscapes configs,
#   setr_vit-l_*_8xb1-80k_cityscapes-768x768.py). No CBT Cityscapes recipe
#   was available here; no Cityscapes training was run.
# - Backbone weights: timm's AugReg ViT-S/16 at 384 converted with
#   tools/convert_vit.py to pretrain/vit-s16_augreg-384_mmseg.pth
#   (docs/configs.md).
_base_ = [
    '../_base_/models/vit_cbt.py',
    'mmseg::_base_/datasets/cityscapes_1024x1024.py',
    '../_base_/default_runtime.py', 'mmseg::_base_/schedules/schedule_80k.py'
]
crop_size = (1024, 1024)
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
    decode_head=dict(in_channels=384, num_classes=19),
    test_cfg=dict(mode='whole'))
optim_wrapper = dict(optimizer=dict(lr=1e-3, weight_decay=0.0))
train_dataloader = dict(batch_size=1)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
