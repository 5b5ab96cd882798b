# The 3x recipe on the 1x schedule (12 epochs, lr steps at 8 and 11), for
# quicker experiments.
_base_ = './mask_rcnn_xcit_3x_coco.py'

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0,
         end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True,
         milestones=[8, 11], gamma=0.1),
]
