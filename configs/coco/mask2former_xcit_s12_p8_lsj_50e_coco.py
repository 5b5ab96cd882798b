# Mask2Former XCiT-S12/8, instance segmentation, LSJ 50 epochs COCO: the
# backbone settings of mask_rcnn_xcit_s12_p8_3x_coco.py (published Mask
# R-CNN box / mask AP 47.0 / 42.3). No XCiT result has been published for
# this head.
_base_ = './_base_/mask2former_xcit_lsj_50e_coco.py'

# ImageNet-1k weights of the published training command (384 px, distilled)
pretrained = ('https://dl.fbaipublicfiles.com/xcit/'
              'xcit_small_12_p8_384_dist.pth')
model = dict(
    backbone=dict(
        arch='small_12_p8', drop_path_rate=0.05, eta=1.0,
        init_cfg=dict(checkpoint=pretrained)),
    panoptic_head=dict(in_channels=[384] * 4))
