# mita-deit-s16-dwc_upernet_8xb2-160k_ade20k-512x512.py for the authors'
# MiTA-DeiT-S/16 with the depth-wise value convolution and the SiLU gate
# (checkpoint keys blocks.{i}.attn.dwc.* and blocks.{i}.attn.qkvg.*).
_base_ = './mita-deit-s16-dwc_upernet_8xb2-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        gate=True,
        init_cfg=dict(
            checkpoint='pretrain/mita-deit-s16-dwc-gate_mmseg.pth')))
