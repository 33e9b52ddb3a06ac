# mita-deit-s16_upernet_8xb2-160k_ade20k-512x512.py for the authors'
# MiTA-DeiT-S/16 with the depth-wise value convolution (checkpoint keys
# blocks.{i}.attn.dwc.*): dwc=True adds it to every layer.
_base_ = './mita-deit-s16_upernet_8xb2-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        dwc=True,
        init_cfg=dict(checkpoint='pretrain/mita-deit-s16-dwc_mmseg.pth')))
