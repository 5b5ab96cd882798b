# UperNet XCiT-T12/16, 160k ADE20K. Published mIoU: 41.5
# (facebookresearch/xcit semantic segmentation README).
_base_ = './_base_/upernet_xcit_160k_ade20k.py'

# ImageNet-1k weights of the published training command (384 px, distilled)
pretrained = ('https://dl.fbaipublicfiles.com/xcit/'
              'xcit_tiny_12_p16_384_dist.pth')
model = dict(
    backbone=dict(
        arch='tiny_12_p16', drop_path_rate=0.0, eta=1.0,
        init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[192] * 4),
    auxiliary_head=dict(in_channels=192))
