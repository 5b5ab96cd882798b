# Mask R-CNN XCiT-S24/16, 3x COCO. Published box / mask AP: 46.5 / 41.8
# (facebookresearch/xcit detection README).
_base_ = './_base_/mask_rcnn_xcit_3x_coco.py'

model = dict(
    backbone=dict(
        arch='small_24_p16', drop_path_rate=0.1, eta=1e-5,
        init_cfg=dict(checkpoint='pretrained/xcit_small_24_p16_224.pth')),
    neck=dict(in_channels=[384] * 4))
