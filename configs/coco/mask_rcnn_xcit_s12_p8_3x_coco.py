# Mask R-CNN XCiT-S12/8, 3x COCO. Published box / mask AP: 47.0 / 42.3
# (facebookresearch/xcit detection README).
_base_ = './_base_/mask_rcnn_xcit_3x_coco.py'

model = dict(
    backbone=dict(
        arch='small_12_p8', drop_path_rate=0.05, eta=1.0,
        init_cfg=dict(checkpoint='pretrained/xcit_small_12_p8_224.pth')),
    neck=dict(in_channels=[384] * 4))
