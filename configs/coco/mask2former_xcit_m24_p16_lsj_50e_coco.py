# Mask2Former XCiT-M24/16, instance segmentation, LSJ 50 epochs COCO: the
# backbone settings of mask_rcnn_xcit_m24_p16_3x_coco.py (published Mask
# R-CNN box / mask AP 46.7 / 42.0). No XCiT result has been published for
# this head.
_base_ = './_base_/mask2former_xcit_lsj_50e_coco.py'

# ImageNet-1k weights of the published training command (384 px, distilled)
pretrained = ('https://dl.fbaipublicfiles.com/xcit/'
              'xcit_medium_24_p16_384_dist.pth')
model = dict(
    backbone=dict(
        arch='medium_24_p16', drop_path_rate=0.15, eta=1e-5,
        init_cfg=dict(checkpoint=pretrained)),
    panoptic_head=dict(in_channels=[512] * 4))
