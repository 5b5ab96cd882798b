# The embedded segmentation demo's data, for every head on it: the synthetic
# ADE20K-format dataset (xcit_dense/datasets/synthetic_ade20k.py;
# `make demo-ade20k` generates it in data/synthetic_ade20k), 128x128 crops,
# mmseg's IoUMetric (aAcc, mIoU, mAcc). Only variables (prefixed `demo_`, so
# that no key overlaps a recipe's): a demo config inherits this file beside
# its recipe and sets `train_dataloader = {{_base_.demo_train_dataloader}}`
# and so on.
demo_data_root = 'data/synthetic_ade20k'
demo_classes = ('background', 'disc', 'square', 'triangle', 'stripes')
demo_metainfo = dict(classes=demo_classes,
                     palette=[[120, 120, 120], [220, 20, 60], [0, 128, 255],
                              [60, 180, 75], [255, 200, 0]])
demo_num_classes = len(demo_classes)
demo_crop_size = (128, 128)

demo_dataset = dict(type='BaseSegDataset', data_root=demo_data_root,
                    metainfo=demo_metainfo, reduce_zero_label=True,
                    img_suffix='.jpg', seg_map_suffix='.png')
demo_train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='xcit_dense.CheckSegLabels', num_classes=demo_num_classes),
    dict(type='RandomResize', scale=demo_crop_size, ratio_range=(0.75, 1.5),
         keep_ratio=True),
    dict(type='RandomCrop', crop_size=demo_crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
demo_test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='xcit_dense.CheckSegLabels', num_classes=demo_num_classes),
    dict(type='PackSegInputs'),
]
demo_train_dataloader = dict(
    batch_size=8, num_workers=1, persistent_workers=True,
    dataset=dict(
        _delete_=True, **demo_dataset, pipeline=demo_train_pipeline,
        data_prefix=dict(img_path='images/training',
                         seg_map_path='annotations/training')))
demo_val_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=True,
    dataset=dict(
        _delete_=True, **demo_dataset, pipeline=demo_test_pipeline,
        data_prefix=dict(img_path='images/validation',
                         seg_map_path='annotations/validation')))
demo_val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
