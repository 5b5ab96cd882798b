# Cascade Mask R-CNN XCiT-S12/16, 3x COCO: the backbone settings of
# mask_rcnn_xcit_s12_p16_3x_coco.py (published Mask R-CNN box / mask AP
# 45.3 / 40.8). No XCiT result has been published for this head.
_base_ = './_base_/cascade_mask_rcnn_xcit_3x_coco.py'

# ImageNet-1k weights of the published training command (384 px, distilled)
pretrained = ('https://dl.fbaipublicfiles.com/xcit/'
              'xcit_small_12_p16_384_dist.pth')
model = dict(
    backbone=dict(
        arch='small_12_p16', drop_path_rate=0.05, eta=1.0,
        init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[384] * 4))
