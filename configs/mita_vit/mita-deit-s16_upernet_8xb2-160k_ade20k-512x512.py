# Fine-tune the authors' MiTA-DeiT-S/16 (their plain checkpoint) with
# MultiLevelNeck + UPerNet on ADE20K 512 x 512: the recipe of
# mita-vit-s16_upernet_8xb2-160k_ade20k-512x512.py with what their weights
# need (docs/pretrained.md, "The authors' MiTA-DeiT checkpoints"):
# - DeiT's input normalisation (ImageNet mean/std, not AugReg's [-1, 1]);
# - landmarks='official': their code pools the landmarks from q[:, :-1]
#   (the cls token and every patch but the last);
# - m = k = 49 (the paper's ADE20K setting; weights do not store them).
# Weights: their checkpoint converted with tools/convert_vit.py.
# DWC / DWC + gate checkpoints: the -dwc / -dwc-gate configs.
_base_ = './mita-vit-s16_upernet_8xb2-160k_ade20k-512x512.py'
model = dict(
    data_preprocessor=dict(
        mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375]),
    backbone=dict(
        mita_cfg=dict(landmarks='official'),
        init_cfg=dict(checkpoint='pretrain/mita-deit-s16_mmseg.pth')))
