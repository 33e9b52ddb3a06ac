# Full-attention ViT-B/16 + CBT decode head (Contract-and-Broadcast
# Transformer, arXiv 2509.16875), the twin of mita-vit_cbt.py. The CBT head
# reads the last layer's patch tokens; its defaults are the paper's (3
# layers, 3 heads of 100 dims, 10 x 10 representatives).
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255)
model = dict(
    type='EncoderDecoder',
    data_preprocessor=data_preprocessor,
    backbone=dict(
        type='VisionTransformer',
        img_size=(512, 512),
        patch_size=16,
        in_channels=3,
        embed_dims=768,
        num_layers=12,
        num_heads=12,
        mlp_ratio=4,
        out_indices=-1,
        qkv_bias=True,
        drop_rate=0.0,
        attn_drop_rate=0.0,
        drop_path_rate=0.1,
        with_cls_token=True,
        norm_cfg=dict(type='LN', eps=1e-6),
        act_cfg=dict(type='GELU'),
        final_norm=True,
        interpolate_mode='bicubic'),
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
            type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'))
