# MiTA twin of vit-b16_cbt_8xb1-80k_cityscapes-1024x1024.py:
# identical but for MiTA attention in every backbone layer, with the mita_cfg of
# ../_base_/models/mita-vit.py (the paper's ADE20K setting, here on 4097
# training and 8193 test tokens). Same checkpoint keys: it loads the same
# converted weights.
_base_ = [
    './vit-b16_cbt_8xb1-80k_cityscapes-1024x1024.py',
    '../_base_/models/mita-vit.py'
]
model = dict(backbone=dict(type='MiTAViT', mita_cfg={{_base_.mita_cfg}}))
