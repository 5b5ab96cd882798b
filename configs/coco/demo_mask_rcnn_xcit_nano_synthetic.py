# The embedded demo: Mask R-CNN with XCiT-N12/16 trained from scratch on the
# synthetic shapes dataset (xcit_dense/datasets/synthetic_coco.py; `make demo`
# generates it in data/synthetic_coco), on CPU, evaluated with COCO bbox and
# segm mAP. The recipe is the COCO one; what differs is for a 2-core CPU:
# 128x128 images, a narrower FPN and heads, higher lr, a short schedule.
_base_ = './_base_/mask_rcnn_xcit_1x_coco.py'

data_root = 'data/synthetic_coco/'
metainfo = dict(
    classes=('circle', 'square', 'triangle'),
    palette=[(220, 20, 60), (0, 128, 255), (60, 180, 75)])
width = 128  # FPN and head channels

model = dict(
    backbone=dict(arch='nano_12_p16', drop_path_rate=0., eta=1.0,
                  init_cfg=None),
    neck=dict(in_channels=[128] * 4, out_channels=width),
    rpn_head=dict(in_channels=width, feat_channels=width),
    roi_head=dict(
        # fixed RoIAlign sampling: mmcv's adaptive sampling is slow on CPU
        bbox_roi_extractor=dict(
            out_channels=width,
            roi_layer=dict(sampling_ratio=2, use_torchvision=True)),
        bbox_head=dict(in_channels=width, fc_out_channels=256,
                       num_classes=3),
        mask_roi_extractor=dict(
            out_channels=width,
            roi_layer=dict(sampling_ratio=2, use_torchvision=True)),
        mask_head=dict(in_channels=width, conv_out_channels=width,
                       num_classes=3)),
    train_cfg=dict(rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(rcnn=dict(max_per_img=20)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                    'scale_factor')),
]
train_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=True,
    dataset=dict(
        data_root=data_root, metainfo=metainfo,
        ann_file='annotations/train.json', data_prefix=dict(img='train/'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=True,
    dataset=dict(
        data_root=data_root, metainfo=metainfo,
        ann_file='annotations/val.json', data_prefix=dict(img='val/'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/val.json')
test_evaluator = val_evaluator

max_iters = 800
train_cfg = dict(
    _delete_=True, type='xcit_dense.IterBasedTrainLoop', max_iters=max_iters,
    val_interval=max_iters)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0,
         end=100),
    dict(type='MultiStepLR', by_epoch=False, begin=0, end=max_iters,
         milestones=[int(max_iters * 0.8)], gamma=0.1),
]
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(lr=1e-3))
default_hooks = dict(
    logger=dict(interval=25),
    checkpoint=dict(by_epoch=False, interval=max_iters, max_keep_ckpts=1))
log_processor = dict(by_epoch=False, window_size=25)
sync_bn = None
randomness = dict(seed=0)
# test-time augmentation (tools/test.py --tta) at the demo's scale: 96, 128
# and 160 px, each as it is and flipped
tta_pipeline = [
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
