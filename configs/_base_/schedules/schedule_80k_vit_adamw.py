# mmseg's ViT UPerNet recipe (schedule_160k_vit_adamw.py: AdamW lr 6e-5,
# weight decay 0.01, none on pos_embed, cls_token, norms; 1500 iterations of
# linear warm-up, then poly, power 1, to the end of training) over mmseg's
# Cityscapes length of 80k iterations (schedule_80k.py: validation and
# checkpoints every 8k).
_base_ = './schedule_160k_vit_adamw.py'
train_cfg = dict(max_iters=80000, val_interval=8000)
default_hooks = dict(checkpoint=dict(interval=8000))
