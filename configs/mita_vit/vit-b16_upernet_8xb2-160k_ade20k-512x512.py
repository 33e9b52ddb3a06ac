# ViT-B/16 + MultiLevelNeck + UPerNet on ADE20K 512 x 512, full attention
# (twin of mita-vit-b16_upernet_8xb2-160k_ade20k-512x512.py). mmseg's ViT
# UPerNet recipe: 16 images in total (8 GPUs x 2), AdamW lr 6e-5, weight
# decay 0.01 (none on pos_embed, cls_token, norms), 1500 iterations of
# linear warm-up, then poly (power 1) to 160k iterations.
# Backbone weights: timm's AugReg ViT-B/16 at 384 converted with
# tools/convert_vit.py to pretrain/vit-b16_augreg-384_mmseg.pth
# (docs/configs.md).
_base_ = [
    '../_base_/models/vit_mln_upernet.py', 'mmseg::_base_/datasets/ade20k.py',
    '../_base_/default_runtime.py', '../_base_/schedules/schedule_160k_vit_adamw.py'
]
crop_size = (512, 512)
model = dict(
    # timm's AugReg ViTs take inputs scaled to [-1, 1]
    data_preprocessor=dict(size=crop_size, mean=[127.5] * 3, std=[127.5] * 3),
    backbone=dict(
        img_size=crop_size,
        patch_bias=True,
        final_norm=True,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='pretrain/vit-b16_augreg-384_mmseg.pth')))
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
