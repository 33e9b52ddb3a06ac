# MiTA twin of vit-b16_upernet_8xb1-80k_cityscapes-1024x1024.py:
# identical but for MiTA attention in every backbone layer (m = 7 x 7 = 49
# landmarks, k = 49 routed keys, the paper's ADE20K setting, here on 4097
# training and 8193 test tokens). Same checkpoint keys: it loads the same
# converted weights.
_base_ = './vit-b16_upernet_8xb1-80k_cityscapes-1024x1024.py'
model = dict(
    backbone=dict(
        type='MiTAViT',
        # _delete_: replaces the twin's mita_cfg=None (mmengine merges a dict
        # only into a dict)
        mita_cfg=dict(
            _delete_=True, pool_size=7, topk=49,
            layers='all', backend='auto')))
