# Full-attention ViT-B/16 + CBT decode head (Contract-and-Broadcast
# Transformer, arXiv 2509.16875). The CBT head reads the last layer's patch
# tokens; its defaults are the paper's (3 layers, 3 heads of 100 dims,
# 10 x 10 representatives).
_base_ = './vit-b16.py'
model = dict(
    backbone=dict(out_indices=-1, final_norm=True),
    decode_head=dict(
        type='CBTHead',
        in_channels=768,
        num_layers=3,
        num_heads=3,
        head_dims=100,
        pool_size=10,
        num_classes=150,
        align_corners=False,
        loss_decode=dict(
            type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)))
