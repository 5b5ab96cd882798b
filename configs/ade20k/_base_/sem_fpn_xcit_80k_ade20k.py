# Semantic FPN with an XCiT backbone on ADE20K, 80k iterations. Per-model
# files change only the preset, the neck and head channels, drop path and eta.
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    './xcit_ade20k_recipe.py',
    'mmseg::_base_/schedules/schedule_80k.py',
]
model = dict(
    data_preprocessor=dict(size={{_base_.crop_size}}),
    pretrained=None,
    backbone={{_base_.xcit_backbone}},
    # FPN neck: 4 outputs of embed_dim channels; FPN head: 128 channels
    neck=dict(in_channels=[384, 384, 384, 384], out_channels=384,
              num_outs=4),
    decode_head=dict(in_channels=[384, 384, 384, 384], channels=128,
                     num_classes=150,
                     norm_cfg=dict(type='SyncBN', requires_grad=True)))

optim_wrapper = {{_base_.xcit_optim_wrapper}}
# the published schedule (mmcv 1.x's poly policy with a linear warm-up):
# lr(t) = lr * (1 - t / max_iters) * w(t), w rising linearly from 1e-6 to 1
# over the first 1500 iterations; mmengine's schedulers multiply where they
# overlap, so the poly decay starts at iteration 0 beside the warm-up
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0,
         end=1500),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=0,
         end=80000),
]
# mmengine's iteration loop, resumable at any iteration to the same result
train_cfg = dict(type='xcit_dense.IterBasedTrainLoop')
# checkpoints written to a temporary name and renamed into place
default_hooks = dict(
    checkpoint=dict(backend_args=dict(backend='atomic_local')))
