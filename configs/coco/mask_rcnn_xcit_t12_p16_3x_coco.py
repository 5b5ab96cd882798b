# Mask R-CNN XCiT-T12/16, 3x COCO. Published box / mask AP: 42.7 / 38.5
# (facebookresearch/xcit detection README).
_base_ = './_base_/mask_rcnn_xcit_3x_coco.py'

# ImageNet-1k weights of the published training command (384 px, distilled)
pretrained = ('https://dl.fbaipublicfiles.com/xcit/'
              'xcit_tiny_12_p16_384_dist.pth')
model = dict(
    backbone=dict(
        arch='tiny_12_p16', drop_path_rate=0.0, eta=1.0,
        init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[192] * 4))
