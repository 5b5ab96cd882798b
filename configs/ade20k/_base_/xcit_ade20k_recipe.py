# What the UperNet and Semantic FPN recipes share (facebookresearch/xcit
# semantic_segmentation/configs/xcit/{upernet,sem_fpn}/*.py): the XCiT
# backbone, ADE20K 512x512 crops, 16 images per batch in total (8 GPUs x 2),
# AdamW lr 6e-5 with weight decay 0.01 except on the parameters whose name
# contains 'norm', poly decay (power 1, min lr 0) with a 1500-iteration
# linear warm-up from 1e-6 of the lr, single-scale whole-image test at
# (2048, 512).
_base_ = [
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    '../../_base_/xcit_backbone.py',
]
custom_imports = dict(imports=['xcit_dense'], allow_failed_imports=False)

crop_size = (512, 512)

train_dataloader = dict(batch_size=2, num_workers=2)
# the batch the lr was set for: `tools/train.py --auto-scale-lr` scales the lr
# to a run's total batch (mmengine's Runner), as mmdet's recipes do
auto_scale_lr = dict(enable=False, base_batch_size=16)

# the recipes' `optim_wrapper` (replacing mmseg's); their backbone is
# `xcit_backbone` of ../../_base_/xcit_backbone.py. The published rule: no
# weight decay on the parameters whose name contains 'norm' (custom_keys
# match substrings of the full name, in mmcv 1.x as in mmengine: the blocks'
# LayerNorms norm1-3). An option of ours, off: apply_no_weight_decay=True
# also exempts what the backbone's no_weight_decay() names (layer-scale
# gammas, XCA temperatures, the positional encoder, its BatchNorms), and
# mmengine's norm_decay_mult=0. every norm layer of the heads
# (docs/training.md).
xcit_optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='xcit_dense.NoDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999),
                   weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)},
                       apply_no_weight_decay=False))
# SyncBN in every BatchNorm when distributed on GPUs, as mmseg's heads
# (tools/train.py keeps BatchNorm on CPU, where SyncBN cannot run).
sync_bn = 'torch'
# published (mmseg 0.11) checkpoints converted on loading, every loaded one
# checked strictly; a checkpoint on SIGTERM / SIGINT / SIGUSR1
custom_hooks = {{_base_.xcit_custom_hooks}}
