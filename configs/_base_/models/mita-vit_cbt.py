# MiTA-ViT + CBT decode head: vit_cbt.py with MiTA attention in every layer
# (paper setting for ADE20K: m = k = 49).
_base_ = './vit_cbt.py'
model = dict(
    backbone=dict(
        type='MiTAViT',
        # _delete_: replaces the twin's mita_cfg=None (mmengine merges a dict
        # only into a dict)
        mita_cfg=dict(
            _delete_=True, pool_size=7, topk=49,
            layers='all', backend='auto')))
