# MiTA twin of vit-l16_cbt_8xb1-160k_ade20k-640x640.py: identical but for
# MiTA attention in every backbone layer (m = 7 x 7 = 49 landmarks, k = 49
# routed keys; the paper's ADE20K setting). Same checkpoint keys: it loads
# the same converted full-attention weights.
_base_ = './vit-l16_cbt_8xb1-160k_ade20k-640x640.py'
model = dict(
    backbone=dict(
        type='MiTAViT',
        # _delete_: replaces the twin's mita_cfg=None (mmengine merges a dict
        # only into a dict)
        mita_cfg=dict(
            _delete_=True, pool_size=7, topk=49,
            layers='all', backend='auto')))
