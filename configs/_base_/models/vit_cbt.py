# The full-attention ViT-B/16 of vit_mln_upernet.py + CBT decode head
# (Contract-and-Broadcast Transformer, arXiv 2509.16875) instead of the neck
# and heads. The CBT head reads the last layer's patch tokens; its settings
# are the paper's (3 layers, 3 heads of 100 dims, 10 x 10 representatives).
_base_ = './vit_mln_upernet.py'
model = dict(
    backbone=dict(out_indices=-1, final_norm=True),
    neck=None,
    decode_head=dict(
        _delete_=True,
        type='CBTHead',
        in_channels=768,
        num_layers=3,
        num_heads=3,
        head_dims=100,
        pool_size=10,
        num_classes=150,
        align_corners=False,
        loss_decode=dict(
            type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)),
    auxiliary_head=None)
