# ViT-L/16 + MultiLevelNeck + UPerNet on ADE20K 640 x 640 with
# sliding-window inference, full attention (twin of
# mita-vit-l16_upernet_8xb2-160k_ade20k-640x640.py); mmseg's ViT UPerNet
# recipe as in vit-b16_upernet_8xb2-160k_ade20k-512x512.py.
_base_ = [
    '../_base_/models/vit_mln_upernet.py',
    'mmseg::_base_/datasets/ade20k_640x640.py', '../_base_/default_runtime.py',
    '../_base_/schedules/schedule_160k_vit_adamw.py'
]
crop_size = (640, 640)
dims = 1024
model = dict(
    data_preprocessor=dict(size=crop_size, mean=[127.5] * 3, std=[127.5] * 3),
    backbone=dict(
        img_size=crop_size,
        embed_dims=dims,
        num_layers=24,
        num_heads=16,
        out_indices=(5, 11, 17, 23),
        patch_bias=True,
        final_norm=True,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='pretrain/vit-l16_augreg-384_mmseg.pth')),
    neck=dict(in_channels=[dims] * 4, out_channels=dims),
    decode_head=dict(in_channels=[dims] * 4),
    auxiliary_head=dict(in_channels=dims),
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(608, 608)))
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
