# The procedural demo dataset of tools/make_demo_data.py, in ADE20K's layout
# and conventions (annotation 0 = ignore, reduce_zero_label=True): mmseg's
# ade20k.py with the demo's classes, 96 x 96 pipelines and loaders.
_base_ = 'mmseg::_base_/datasets/ade20k.py'
dataset_type = 'BaseSegDataset'
data_root = 'data/demo_ade'
metainfo = dict(
    classes=('sky', 'ground', 'stripes', 'checker', 'dots'),
    palette=[[70, 130, 180], [140, 100, 60], [220, 20, 60], [250, 170, 30],
             [0, 180, 120]])
crop_size = (96, 96)
# CheckSegMap (mmseg_mita): clear errors for annotations that do not match
# their image's size or hold labels outside the classes.
check_seg_map = dict(type='CheckSegMap', num_classes=len(metainfo['classes']))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    check_seg_map,
    dict(
        type='RandomResize',
        scale=(96, 96),
        ratio_range=(0.75, 1.5),
        keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs')
]
# Test at the image's own size (the demo images are 96 x 96): a keep-ratio
# resize into 96 x 96 would squeeze a 16 x 4000 panorama to 0 pixels.
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    check_seg_map,
    dict(type='PackSegInputs')
]
# `tools/test.py ... --tta`: 3 scales x (no flip, flip), averaged by mmseg's
# SegTTAModel.
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(
        type='TestTimeAug',
        transforms=[
            [
                dict(type='Resize', scale_factor=r, keep_ratio=True)
                for r in (0.75, 1.0, 1.25)
            ],
            [
                dict(type='RandomFlip', prob=0., direction='horizontal'),
                dict(type='RandomFlip', prob=1., direction='horizontal')
            ],
            [dict(type='LoadAnnotations', reduce_zero_label=True)],
            [dict(type='PackSegInputs')],
        ])
]
_dataset = dict(
    type=dataset_type,
    data_root=data_root,
    metainfo=metainfo,
    img_suffix='.jpg',
    seg_map_suffix='.png',
    reduce_zero_label=True)
# mmseg's ADE20K loaders (layout, samplers, batch 1 for validation) on the
# demo dataset.
train_dataloader = dict(
    batch_size=8,
    num_workers=2,
    dataset=dict(**_dataset, pipeline=train_pipeline))
val_dataloader = dict(
    num_workers=2, dataset=dict(**_dataset, pipeline=test_pipeline))
test_dataloader = val_dataloader
