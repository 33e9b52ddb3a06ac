# mmseg's upernet_vit-b16_ln_mln (ViT-B/16 with LN eps 1e-6, MultiLevelNeck,
# UPerHead and an auxiliary FCN head) with MiTAViT as its backbone, full
# attention through F.scaled_dot_product_attention (mita_cfg=None,
# full_attention='sdpa': mmseg's VisionTransformer to float tolerance, same
# weights and keys), so that a MiTA config and its twin differ only in
# attention; `--cfg-options model.backbone.full_attention=mmcv` runs mmseg's
# own attention (mmcv's MultiheadAttention). ADE20K's 150 classes.
_base_ = 'mmseg::_base_/models/upernet_vit-b16_ln_mln.py'
# Test time: images smaller than 32 x 32 are padded (bottom/right; the
# prediction is cropped back to the image): the MultiLevelNeck's 0.5 scale
# needs a patch grid of >= 2 (patch 16), the demo's 0.25 scale >= 4 (patch
# 8). Larger images are not padded.
data_preprocessor = dict(test_cfg=dict(size=(32, 32)))
model = dict(
    pretrained=None,  # the leaf configs load weights through init_cfg
    data_preprocessor=data_preprocessor,
    backbone=dict(
        type='MiTAViT',
        mita_cfg=None,
        full_attention='sdpa',
        drop_path_rate=0.1),
    decode_head=dict(num_classes=150),
    auxiliary_head=dict(num_classes=150))
