# The 3x recipe on the 1x schedule (12 epochs, lr steps at 8 and 11, the
# same warm-up), for quicker experiments. No 1x XCiT config was published;
# these are the steps of mmdet's schedule_1x.py, which the published 3x
# configs start from.
_base_ = './mask_rcnn_xcit_3x_coco.py'

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0,
         end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True,
         milestones=[8, 11], gamma=0.1),
]
