# Mask R-CNN XCiT-M24/16, 3x COCO. Published box / mask AP: 46.7 / 42.0
# (facebookresearch/xcit detection README).
_base_ = './_base_/mask_rcnn_xcit_3x_coco.py'

model = dict(
    backbone=dict(
        arch='medium_24_p16', drop_path_rate=0.15, eta=1e-5,
        init_cfg=dict(checkpoint='pretrained/xcit_medium_24_p16_224.pth')),
    neck=dict(in_channels=[512] * 4))
