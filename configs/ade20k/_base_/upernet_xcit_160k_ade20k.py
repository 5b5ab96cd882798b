# UperNet with an XCiT backbone on ADE20K, 160k iterations. Per-model files
# change only the preset, the head input channels, drop path and eta.
_base_ = [
    'mmseg::_base_/models/upernet_r50.py',
    './xcit_ade20k_recipe.py',
    'mmseg::_base_/schedules/schedule_160k.py',
]
model = dict(
    data_preprocessor=dict(size={{_base_.crop_size}}),
    pretrained=None,
    backbone={{_base_.xcit_backbone}},
    decode_head=dict(
        in_channels=[384, 384, 384, 384], pool_scales=(1, 2, 3, 6),
        channels=512, num_classes=150),
    # auxiliary FCN head on pyramid level 2 (stride 16)
    auxiliary_head=dict(
        in_channels=384, in_index=2, num_classes=150,
        loss_decode=dict(loss_weight=0.4)))

optim_wrapper = {{_base_.xcit_optim_wrapper}}
# the published schedule (mmcv 1.x's poly policy with a linear warm-up):
# lr(t) = lr * (1 - t / max_iters) * w(t), w rising linearly from 1e-6 to 1
# over the first 1500 iterations; mmengine's schedulers multiply where they
# overlap, so the poly decay starts at iteration 0 beside the warm-up
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0,
         end=1500),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=0,
         end=160000),
]
# mmengine's iteration loop, resumable at any iteration to the same result
train_cfg = dict(type='xcit_dense.IterBasedTrainLoop')
# checkpoints written to a temporary name and renamed into place
default_hooks = dict(
    checkpoint=dict(backend_args=dict(backend='atomic_local')))
