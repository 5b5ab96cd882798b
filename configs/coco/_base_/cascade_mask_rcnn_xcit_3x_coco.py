# Cascade Mask R-CNN with an XCiT backbone on COCO, 3x schedule: the XCiT
# Mask R-CNN recipe (./mask_rcnn_xcit_3x_coco.py: AdamW, DETR-style
# multi-scale augmentation, 36 epochs) with mmdet 3.3's Cascade Mask R-CNN
# (mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py: three stages, IoU
# thresholds 0.5 / 0.6 / 0.7, stage loss weights 1 / 0.5 / 0.25, 2000 RPN
# proposals in training) and the box heads of mmdet 3.3's ConvNeXt cascade
# configs (configs/convnext/cascade-mask-rcnn_convnext-t-p4-w7_fpn_4conv1fc-
# giou_amp-ms-crop-3x_coco.py): 4 shared convolutions and 1 fc, SyncBN,
# GIoU loss on decoded boxes. No XCiT result has been published for this
# head. Per-model files change only the preset, the FPN input channels, drop
# path and layer-scale eta (and the layer decay for 24 blocks).
_base_ = './mask_rcnn_xcit_3x_coco.py'

_stage_stds = [[0.1, 0.1, 0.2, 0.2], [0.05, 0.05, 0.1, 0.1],
               [0.033, 0.033, 0.067, 0.067]]
model = dict(
    type='CascadeRCNN',
    roi_head=dict(
        type='CascadeRoIHead',
        num_stages=3,
        stage_loss_weights=[1, 0.5, 0.25],
        # the mask head and both RoI extractors are Mask R-CNN's, as in
        # mmdet's cascade model
        bbox_head=[
            dict(type='ConvFCBBoxHead', num_shared_convs=4, num_shared_fcs=1,
                 in_channels=256, conv_out_channels=256,
                 fc_out_channels=1024, roi_feat_size=7, num_classes=80,
                 bbox_coder=dict(type='DeltaXYWHBBoxCoder',
                                 target_means=[0., 0., 0., 0.],
                                 target_stds=stds),
                 reg_class_agnostic=False, reg_decoded_bbox=True,
                 norm_cfg=dict(type='SyncBN', requires_grad=True),
                 loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False,
                               loss_weight=1.0),
                 loss_bbox=dict(type='GIoULoss', loss_weight=10.0))
            for stds in _stage_stds]),
    train_cfg=dict(
        rpn_proposal=dict(max_per_img=2000),
        rcnn=[
            dict(assigner=dict(type='MaxIoUAssigner', pos_iou_thr=iou,
                               neg_iou_thr=iou, min_pos_iou=iou,
                               match_low_quality=False, ignore_iof_thr=-1),
                 sampler=dict(type='RandomSampler', num=512,
                              pos_fraction=0.25, neg_pos_ub=-1,
                              add_gt_as_proposals=True),
                 mask_size=28, pos_weight=-1, debug=False)
            for iou in (0.5, 0.6, 0.7)]))

# Layer-wise lr decay as the ConvNeXt cascade configs use it (their
# LearningRateDecayOptimizerConstructor, decay_rate 0.7 over 8 levels: the
# stem at 0.7^7 = 0.082 of the lr, the heads at 1), through our constructor
# over XCiT's levels (stem and positional encoding, one per block, the top):
# the same 0.082 at the stem spread evenly over the 13 levels of 12 blocks,
# 0.082^(1/13) = 0.825 per level (24 blocks: 0.082^(1/25) = 0.905).
optim_wrapper = dict(paramwise_cfg=dict(layer_decay_rate=0.825))
