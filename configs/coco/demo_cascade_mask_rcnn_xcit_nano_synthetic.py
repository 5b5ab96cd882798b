# Cascade Mask R-CNN on the embedded demo (the synthetic shapes dataset of
# demo_mask_rcnn_xcit_nano_synthetic.py, whose backbone, data, widths and
# schedule it keeps): the three-stage cascade of
# _base_/cascade_mask_rcnn_xcit_3x_coco.py (mmdet's cascade model, the
# ConvNeXt configs' 4conv1fc GIoU box heads) at the demo's head width, to
# show the head family learning on a CPU.
_base_ = './demo_mask_rcnn_xcit_nano_synthetic.py'

_stage_stds = [[0.1, 0.1, 0.2, 0.2], [0.05, 0.05, 0.1, 0.1],
               [0.033, 0.033, 0.067, 0.067]]
model = dict(
    type='CascadeRCNN',
    roi_head=dict(
        type='CascadeRoIHead',
        num_stages=3,
        stage_loss_weights=[1, 0.5, 0.25],
        bbox_head=[
            dict(type='ConvFCBBoxHead', num_shared_convs=4, num_shared_fcs=1,
                 in_channels=128, conv_out_channels=128,
                 fc_out_channels=256, roi_feat_size=7, num_classes=3,
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
        rcnn=[
            dict(assigner=dict(type='MaxIoUAssigner', pos_iou_thr=iou,
                               neg_iou_thr=iou, min_pos_iou=iou,
                               match_low_quality=False, ignore_iof_thr=-1),
                 sampler=dict(type='RandomSampler', num=64,
                              pos_fraction=0.25, neg_pos_ub=-1,
                              add_gt_as_proposals=True),
                 mask_size=28, pos_weight=-1, debug=False)
            for iou in (0.5, 0.6, 0.7)]))
