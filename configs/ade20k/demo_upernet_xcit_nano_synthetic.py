# The embedded segmentation demo: UperNet with XCiT-N12/16 trained from
# scratch on the synthetic ADE20K-format dataset
# (_base_/demo_data_synthetic_ade20k.py), on CPU, evaluated with mmseg's
# IoUMetric (aAcc, mIoU, mAcc). The recipe is the ADE20K one; what differs is
# for a 2-core CPU: 128x128 images, narrower heads, higher lr, a short
# schedule.
_base_ = ['./_base_/upernet_xcit_160k_ade20k.py',
          './_base_/demo_data_synthetic_ade20k.py']

data_root = {{_base_.demo_data_root}}
metainfo = {{_base_.demo_metainfo}}
num_classes = {{_base_.demo_num_classes}}
crop_size = {{_base_.demo_crop_size}}

model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(arch='nano_12_p16', drop_path_rate=0., eta=1.0,
                  init_cfg=None),
    decode_head=dict(in_channels=[128] * 4, channels=128,
                     num_classes=num_classes),
    auxiliary_head=dict(in_channels=128, channels=64,
                        num_classes=num_classes))

train_pipeline = {{_base_.demo_train_pipeline}}
test_pipeline = {{_base_.demo_test_pipeline}}
train_dataloader = {{_base_.demo_train_dataloader}}
val_dataloader = {{_base_.demo_val_dataloader}}
test_dataloader = val_dataloader
val_evaluator = {{_base_.demo_val_evaluator}}
test_evaluator = val_evaluator

max_iters = 600
train_cfg = dict(type='xcit_dense.IterBasedTrainLoop', max_iters=max_iters,
                 val_interval=max_iters)
# weight decay as the demo's results in the docs were trained: an option of
# ours, none on what the backbone's no_weight_decay() names (norms,
# layer-scale gammas, XCA temperatures, positional encoder) nor on the
# heads' norm layers; the recipe has the published rule
optim_wrapper = dict(
    optimizer=dict(lr=1e-3),
    paramwise_cfg=dict(apply_no_weight_decay=True, norm_decay_mult=0.))
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
