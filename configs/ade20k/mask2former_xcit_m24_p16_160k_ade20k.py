# Mask2Former XCiT-M24/16, 160k ADE20K: the backbone settings of
# upernet_xcit_m24_p16_160k_ade20k.py (published UperNet mIoU 47.6).
# No XCiT result has been published for this head.
_base_ = './_base_/mask2former_xcit_160k_ade20k.py'

# ImageNet-1k weights of the published training command (384 px, distilled)
pretrained = ('https://dl.fbaipublicfiles.com/xcit/'
              'xcit_medium_24_p16_384_dist.pth')
model = dict(
    backbone=dict(
        arch='medium_24_p16', drop_path_rate=0.15, eta=1e-5,
        init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[512] * 4))
