# MiTA twin of vit-mini8_upernet_1xb8-1k_demo-96x96.py: every layer uses
# MiTA with a 4 x 4 landmark grid (m = 16) and k = 16 routed keys, so each
# query sees 32 of the 145 tokens.
_base_ = './vit-mini8_upernet_1xb8-1k_demo-96x96.py'
model = dict(
    backbone=dict(
        type='MiTAViT',
        # _delete_: replaces the twin's mita_cfg=None (mmengine merges a dict
        # only into a dict)
        mita_cfg=dict(
            _delete_=True, pool_size=4, topk=16,
            layers='all', backend='auto')))
