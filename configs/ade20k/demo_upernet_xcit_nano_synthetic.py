# The embedded segmentation demo: UperNet with XCiT-N12/16 trained from
# scratch on the synthetic ADE20K-format dataset
# (xcit_dense/datasets/synthetic_ade20k.py; `make demo-ade20k` generates it in
# data/synthetic_ade20k), on CPU, evaluated with mmseg's IoUMetric (aAcc,
# mIoU, mAcc). The recipe is the ADE20K one; what differs is for a 2-core
# CPU: 128x128 images, narrower heads, higher lr, a short schedule.
_base_ = './_base_/upernet_xcit_160k_ade20k.py'

data_root = 'data/synthetic_ade20k'
classes = ('background', 'disc', 'square', 'triangle', 'stripes')
metainfo = dict(classes=classes,
                palette=[[120, 120, 120], [220, 20, 60], [0, 128, 255],
                         [60, 180, 75], [255, 200, 0]])
num_classes = len(classes)
crop_size = (128, 128)

model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(arch='nano_12_p16', drop_path_rate=0., eta=1.0,
                  init_cfg=None),
    decode_head=dict(in_channels=[128] * 4, channels=128,
                     num_classes=num_classes),
    auxiliary_head=dict(in_channels=128, channels=64,
                        num_classes=num_classes))

dataset = dict(type='BaseSegDataset', data_root=data_root,
               metainfo=metainfo, reduce_zero_label=True,
               img_suffix='.jpg', seg_map_suffix='.png')
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='xcit_dense.CheckSegLabels', num_classes=num_classes),
    dict(type='RandomResize', scale=crop_size, ratio_range=(0.75, 1.5),
         keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='xcit_dense.CheckSegLabels', num_classes=num_classes),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=8, num_workers=1, persistent_workers=True,
    dataset=dict(
        _delete_=True, **dataset, pipeline=train_pipeline,
        data_prefix=dict(img_path='images/training',
                         seg_map_path='annotations/training')))
val_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=True,
    dataset=dict(
        _delete_=True, **dataset, pipeline=test_pipeline,
        data_prefix=dict(img_path='images/validation',
                         seg_map_path='annotations/validation')))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator

max_iters = 600
train_cfg = dict(type='xcit_dense.IterBasedTrainLoop', max_iters=max_iters,
                 val_interval=max_iters)
optim_wrapper = dict(optimizer=dict(lr=1e-3))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0,
         end=50),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=50,
         end=max_iters),
]
default_hooks = dict(
    logger=dict(interval=25),
    checkpoint=dict(by_epoch=False, interval=max_iters, max_keep_ckpts=1))
log_processor = dict(by_epoch=False, window_size=25)
sync_bn = None
randomness = dict(seed=0)
