# ViT-B/16 + CBT on Cityscapes 1024 x 1024 crops, whole-image test at
# 1024 x 2048, full attention computed by F.scaled_dot_product_attention
# (twin of mita-vit-b16_cbt_8xb1-80k_cityscapes-1024x1024.py); recipe and
# sources of the ViT-S config.
_base_ = './vit-s16_cbt_8xb1-80k_cityscapes-1024x1024.py'
model = dict(
    backbone=dict(
        embed_dims=768,
        num_heads=12,
        init_cfg=dict(checkpoint='pretrain/vit-b16_augreg-384_mmseg.pth')),
    decode_head=dict(in_channels=768))
