# Mask R-CNN XCiT-S12/16, 3x COCO. Published box / mask AP: 45.3 / 40.8
# (facebookresearch/xcit detection README).
_base_ = './_base_/mask_rcnn_xcit_3x_coco.py'

model = dict(
    backbone=dict(
        arch='small_12_p16', drop_path_rate=0.05, eta=1.0,
        init_cfg=dict(checkpoint='pretrained/xcit_small_12_p16_224.pth')),
    neck=dict(in_channels=[384] * 4))
