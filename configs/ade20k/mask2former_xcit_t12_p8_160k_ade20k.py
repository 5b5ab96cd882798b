# Mask2Former XCiT-T12/8, 160k ADE20K: the backbone settings of
# upernet_xcit_t12_p8_160k_ade20k.py (published UperNet mIoU 43.5).
# No XCiT result has been published for this head.
_base_ = './_base_/mask2former_xcit_160k_ade20k.py'

# ImageNet-1k weights of the published training command (384 px, distilled)
pretrained = ('https://dl.fbaipublicfiles.com/xcit/'
              'xcit_tiny_12_p8_384_dist.pth')
model = dict(
    backbone=dict(
        arch='tiny_12_p8', drop_path_rate=0.0, eta=1.0,
        init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[192] * 4))
