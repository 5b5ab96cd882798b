# Semantic FPN XCiT-T12/8, 80k ADE20K. Published mIoU: 39.9
# (facebookresearch/xcit semantic segmentation README).
_base_ = './_base_/sem_fpn_xcit_80k_ade20k.py'

# ImageNet-1k weights of the published training command (384 px, distilled)
pretrained = ('https://dl.fbaipublicfiles.com/xcit/'
              'xcit_tiny_12_p8_384_dist.pth')
model = dict(
    backbone=dict(
        arch='tiny_12_p8', drop_path_rate=0.0, eta=1.0,
        init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[192] * 4, out_channels=192),
    decode_head=dict(in_channels=[192] * 4))
