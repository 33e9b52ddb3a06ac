# ViT-L/16 + CBT on ADE20K 640 x 640 with sliding-window inference, full
# attention (twin of mita-vit-l16_cbt_8xb1-160k_ade20k-640x640.py); CBT's
# recipe as in vit-s16_cbt_8xb1-160k_ade20k-512x512.py.
_base_ = [
    '../_base_/models/vit_cbt.py', 'mmseg::_base_/datasets/ade20k_640x640.py',
    '../_base_/default_runtime.py', 'mmseg::_base_/schedules/schedule_160k.py'
]
crop_size = (640, 640)
model = dict(
    data_preprocessor=dict(size=crop_size, mean=[127.5] * 3, std=[127.5] * 3),
    backbone=dict(
        img_size=crop_size,
        embed_dims=1024,
        num_layers=24,
        num_heads=16,
        patch_bias=True,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='pretrain/vit-l16_augreg-384_mmseg.pth')),
    decode_head=dict(in_channels=1024),
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(608, 608)))
optim_wrapper = dict(optimizer=dict(lr=1e-3, weight_decay=0.0))
train_dataloader = dict(batch_size=1)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
