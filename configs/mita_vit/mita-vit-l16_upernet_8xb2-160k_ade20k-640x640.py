# MiTA twin of vit-l16_upernet_8xb2-160k_ade20k-640x640.py: identical but for
# MiTA attention in every backbone layer, with the mita_cfg of
# ../_base_/models/mita-vit.py. Same checkpoint keys: it loads the same
# converted full-attention weights.
_base_ = [
    './vit-l16_upernet_8xb2-160k_ade20k-640x640.py',
    '../_base_/models/mita-vit.py'
]
model = dict(backbone=dict(type='MiTAViT', mita_cfg={{_base_.mita_cfg}}))
