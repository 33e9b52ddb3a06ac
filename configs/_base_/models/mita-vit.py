# MiTA attention for the MiTA-ViT configs: the one place their mita_cfg comes
# from. Every backbone layer uses MiTA with m = 7 x 7 = 49 landmarks and
# k = 49 routed keys, the paper's ADE20K setting. A MiTA config takes its
# full-attention twin and this file as bases, and sets
#     model = dict(backbone=dict(type='MiTAViT', mita_cfg=mita_cfg))
mita_cfg = dict(
    _delete_=True, pool_size=7, topk=49, layers='all', backend='auto')
