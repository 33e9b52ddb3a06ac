# ViT-S/16 + MultiLevelNeck + UPerNet on Cityscapes 1024 x 1024 crops,
# whole-image test at 1024 x 2048, full attention computed by
# F.scaled_dot_product_attention (twin of
# mita-vit-s16_upernet_8xb1-80k_cityscapes-1024x1024.py); recipe and
# sources of the ViT-B config.
_base_ = './vit-b16_upernet_8xb1-80k_cityscapes-1024x1024.py'
dims = 384
model = dict(
    backbone=dict(
        embed_dims=dims,
        num_heads=6,
        init_cfg=dict(checkpoint='pretrain/vit-s16_augreg-384_mmseg.pth')),
    neck=dict(in_channels=[dims] * 4, out_channels=dims),
    decode_head=dict(in_channels=[dims] * 4),
    auxiliary_head=dict(in_channels=dims))
