# Mask R-CNN XCiT-M24/8, 3x COCO. Published box / mask AP: 48.5 / 43.7
# (facebookresearch/xcit detection README).
_base_ = './_base_/mask_rcnn_xcit_3x_coco.py'

# ImageNet-1k weights of the published training command (384 px, distilled)
pretrained = ('https://dl.fbaipublicfiles.com/xcit/'
              'xcit_medium_24_p8_384_dist.pth')
model = dict(
    backbone=dict(
        arch='medium_24_p8', drop_path_rate=0.15, eta=1e-5,
        init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[512] * 4))
