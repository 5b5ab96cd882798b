# The embedded demo's data, for every head on it: the synthetic shapes
# dataset (xcit_dense/datasets/synthetic_coco.py; `make demo` generates it in
# data/synthetic_coco), 128x128 images, COCO bbox and segm mAP. Only
# variables (prefixed `demo_`, so that no key overlaps a recipe's): a demo
# config inherits this file beside its recipe and sets
# `train_dataloader = {{_base_.demo_train_dataloader}}` and so on.
demo_data_root = 'data/synthetic_coco/'
demo_metainfo = dict(
    classes=('circle', 'square', 'triangle'),
    palette=[(220, 20, 60), (0, 128, 255), (60, 180, 75)])
demo_num_classes = 3

demo_train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
demo_test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                    'scale_factor')),
]
# iteration-based: an endless sampler, as mmdet's iteration-based COCO
# recipes (configs/common/ms-poly-90k_coco-instance.py) and the ADE20K demo
# (a finite one is restarted every epoch: a warning and a 2 s pause each time)
demo_train_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        data_root=demo_data_root, metainfo=demo_metainfo,
        ann_file='annotations/train.json', data_prefix=dict(img='train/'),
        pipeline=demo_train_pipeline))
demo_val_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=True,
    dataset=dict(
        data_root=demo_data_root, metainfo=demo_metainfo,
        ann_file='annotations/val.json', data_prefix=dict(img='val/'),
        pipeline=demo_test_pipeline))
demo_val_evaluator = dict(ann_file=demo_data_root + 'annotations/val.json')

# test-time augmentation (tools/test.py --tta) at the demo's scale: 96, 128
# and 160 px, each as it is and flipped
demo_tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TestTimeAug',
         transforms=[
             [dict(type='Resize', scale=(s, s), keep_ratio=True)
              for s in (96, 128, 160)],
             [dict(type='RandomFlip', prob=1.),
              dict(type='RandomFlip', prob=0.)],
             [dict(type='PackDetInputs',
                   meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                              'scale_factor', 'flip', 'flip_direction'))],
         ]),
]
