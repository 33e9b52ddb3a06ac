# ViT-B/16 + CBT on ADE20K 512 x 512, full attention (twin of
# mita-vit-b16_cbt_8xb1-160k_ade20k-512x512.py); recipe of the ViT-S config.
_base_ = './vit-s16_cbt_8xb1-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        embed_dims=768,
        num_heads=12,
        init_cfg=dict(checkpoint='pretrain/vit-b16_augreg-384_mmseg.pth')),
    decode_head=dict(in_channels=768))
