# MiTA twin of vit-s16_cbt_8xb1-160k_ade20k-512x512.py: identical but for
# MiTA attention in every backbone layer, with the mita_cfg of
# ../_base_/models/mita-vit.py. Same checkpoint keys: it loads the same
# converted full-attention weights.
_base_ = [
    './vit-s16_cbt_8xb1-160k_ade20k-512x512.py',
    '../_base_/models/mita-vit.py'
]
model = dict(backbone=dict(type='MiTAViT', mita_cfg={{_base_.mita_cfg}}))
