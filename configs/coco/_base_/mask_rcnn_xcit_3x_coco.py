# Mask R-CNN with an XCiT backbone on COCO, 3x schedule: the published recipe
# (facebookresearch/xcit detection configs, which follow the Swin Transformer
# detection recipe). Per-model files change only the preset, the FPN input
# channels, drop path and layer-scale eta.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
    '../../_base_/xcit_backbone.py',
    './instance_seg_tta.py',  # tools/test.py --tta
]
custom_imports = dict(imports=['xcit_dense', 'xcit_dense.tta'],
                      allow_failed_imports=False)

model = dict(
    backbone={{_base_.xcit_backbone}},
    # One FPN input per pyramid level (strides 4, 8, 16, 32), each embed_dim
    # wide; the RoI extractors of the base model already use these strides.
    neck=dict(in_channels=[384, 384, 384, 384]))

# DETR-style augmentation: flip, then either a multi-scale resize or
# resize + absolute-range crop + multi-scale resize; padding to 32 is done by
# the data preprocessor (pad_size_divisor=32).
_multi_scale = [(1333, s) for s in range(480, 801, 32)]
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(
        type='RandomChoice',
        transforms=[
            [dict(type='RandomChoiceResize', scales=_multi_scale,
                  keep_ratio=True)],
            [
                dict(type='RandomChoiceResize',
                     scales=[(1333, 400), (1333, 500), (1333, 600)],
                     keep_ratio=True),
                dict(type='RandomCrop', crop_type='absolute_range',
                     crop_size=(384, 600), allow_negative_crop=True),
                dict(type='RandomChoiceResize', scales=_multi_scale,
                     keep_ratio=True),
            ],
        ]),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(batch_size=2, num_workers=2,
                        dataset=dict(pipeline=train_pipeline))

# The published optimizer (facebookresearch/xcit detection/configs/xcit/
# mask_rcnn_xcit_*_3x_coco.py): AdamW, no weight decay on the parameters
# whose name contains 'norm' (custom_keys match substrings of the full
# name, in mmcv 1.x as in mmengine: the blocks' LayerNorms norm1-3), in
# mixed precision (tools/train.py falls back to fp32 on machines without a
# GPU). An option of ours, off: apply_no_weight_decay=True also exempts what
# the backbone's no_weight_decay() names (layer-scale gammas, XCA
# temperatures, the positional encoder, its BatchNorms), and mmengine's
# norm_decay_mult=0. every norm layer of the heads (docs/training.md).
optim_wrapper = dict(
    type='AmpOptimWrapper',
    constructor='xcit_dense.NoDecayOptimWrapperConstructor',
    optimizer=dict(
        _delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999),
        weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)},
                       apply_no_weight_decay=False))

max_epochs = 36
# mmengine's epoch loop, resumable at any iteration to the same result
train_cfg = dict(
    type='xcit_dense.EpochBasedTrainLoop', max_epochs=max_epochs)
# the published schedule: a linear warm-up over 500 iterations from 0.001 of
# the lr (its _base_/schedules/schedule_1x.py, as mmdet's schedule_1x.py
# here), lr x0.1 after epochs 27 and 33
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0,
         end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True,
         milestones=[27, 33], gamma=0.1),
]
# 16 images per batch in total (8 GPUs x 2); --auto-scale-lr rescales the lr
# for other totals.
auto_scale_lr = dict(enable=False, base_batch_size=16)
# SyncBN in the backbone's BatchNorms when distributed on GPUs (tools/train.py
# keeps BatchNorm on CPU, where SyncBN cannot run).
sync_bn = 'torch'
# published (mmdet 2.11) checkpoints converted on loading, every loaded one
# checked strictly; a checkpoint on SIGTERM / SIGINT / SIGUSR1
custom_hooks = {{_base_.xcit_custom_hooks}}
# checkpoints written to a temporary name and renamed into place
default_hooks = dict(
    checkpoint=dict(backend_args=dict(backend='atomic_local')))
