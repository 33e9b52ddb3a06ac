# ViT-B/16 (LN eps 1e-6) in an EncoderDecoder: the backbone shared by
# vit_mln_upernet.py and vit_cbt.py. Full attention through
# F.scaled_dot_product_attention (MiTAViT with mita_cfg=None,
# full_attention='sdpa': mmseg's VisionTransformer to float tolerance, same
# weights and keys), so that a MiTA config and its twin differ only in
# attention; `--cfg-options model.backbone.full_attention=mmcv` runs mmseg's
# own attention (mmcv's MultiheadAttention).
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255,
    # Test time: images smaller than 32 x 32 are padded (bottom/right; the
    # prediction is cropped back to the image): the MultiLevelNeck's 0.5
    # scale needs a patch grid of >= 2 (patch 16), the demo's 0.25 scale
    # >= 4 (patch 8). Larger images are not padded.
    test_cfg=dict(size=(32, 32)))
model = dict(
    type='EncoderDecoder',
    data_preprocessor=data_preprocessor,
    backbone=dict(
        type='MiTAViT',
        mita_cfg=None,
        full_attention='sdpa',
        img_size=(512, 512),
        patch_size=16,
        in_channels=3,
        embed_dims=768,
        num_layers=12,
        num_heads=12,
        mlp_ratio=4,
        qkv_bias=True,
        drop_rate=0.0,
        attn_drop_rate=0.0,
        drop_path_rate=0.1,
        with_cls_token=True,
        norm_cfg=dict(type='LN', eps=1e-6),
        act_cfg=dict(type='GELU'),
        interpolate_mode='bicubic'),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'))
