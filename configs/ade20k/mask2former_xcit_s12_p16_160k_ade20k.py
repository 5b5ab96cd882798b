# Mask2Former XCiT-S12/16, 160k ADE20K: the backbone settings of
# upernet_xcit_s12_p16_160k_ade20k.py (published UperNet mIoU 45.9).
# No XCiT result has been published for this head.
_base_ = './_base_/mask2former_xcit_160k_ade20k.py'

# ImageNet-1k weights of the published training command (384 px, distilled)
pretrained = ('https://dl.fbaipublicfiles.com/xcit/'
              'xcit_small_12_p16_384_dist.pth')
model = dict(
    backbone=dict(
        arch='small_12_p16', drop_path_rate=0.05, eta=1.0,
        init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[384] * 4))
