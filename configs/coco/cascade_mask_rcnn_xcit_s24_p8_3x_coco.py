# Cascade Mask R-CNN XCiT-S24/8, 3x COCO: the backbone settings of
# mask_rcnn_xcit_s24_p8_3x_coco.py (published Mask R-CNN box / mask AP
# 48.1 / 43.0). No XCiT result has been published for this head.
_base_ = './_base_/cascade_mask_rcnn_xcit_3x_coco.py'

# ImageNet-1k weights of the published training command (384 px, distilled)
pretrained = ('https://dl.fbaipublicfiles.com/xcit/'
              'xcit_small_24_p8_384_dist.pth')
model = dict(
    backbone=dict(
        arch='small_24_p8', drop_path_rate=0.1, eta=1e-5,
        init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[384] * 4))
optim_wrapper = dict(paramwise_cfg=dict(layer_decay_rate=0.905))
