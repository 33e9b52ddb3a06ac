# MiTA twin of vit-mini8_upernet_1xb8-1k_demo-96x96.py: every layer uses
# MiTA with the mita_cfg of ../_base_/models/mita-vit.py but a 4 x 4 landmark
# grid (m = 16) and k = 16 routed keys, so each query sees 32 of the 145
# tokens.
_base_ = [
    './vit-mini8_upernet_1xb8-1k_demo-96x96.py', '../_base_/models/mita-vit.py'
]
mita_cfg = dict(_base_.mita_cfg, pool_size=4, topk=16)
model = dict(backbone=dict(type='MiTAViT', mita_cfg=mita_cfg))
