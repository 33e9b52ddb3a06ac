# ViT-S/16 + MultiLevelNeck + UPerNet on ADE20K 512 x 512, full attention
# (twin of mita-vit-s16_upernet_8xb2-160k_ade20k-512x512.py); recipe of
# the ViT-B config.
_base_ = './vit-b16_upernet_8xb2-160k_ade20k-512x512.py'
dims = 384
model = dict(
    backbone=dict(
        embed_dims=dims,
        num_heads=6,
        init_cfg=dict(checkpoint='pretrain/vit-s16_augreg-384_mmseg.pth')),
    neck=dict(in_channels=[dims] * 4, out_channels=dims),
    decode_head=dict(in_channels=[dims] * 4),
    auxiliary_head=dict(in_channels=dims))
