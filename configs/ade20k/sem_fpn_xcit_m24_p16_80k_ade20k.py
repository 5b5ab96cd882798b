# Semantic FPN XCiT-M24/16, 80k ADE20K. Published mIoU: 45.9
# (facebookresearch/xcit semantic segmentation README).
_base_ = './_base_/sem_fpn_xcit_80k_ade20k.py'

# ImageNet-1k weights of the published training command (384 px, distilled)
pretrained = ('https://dl.fbaipublicfiles.com/xcit/'
              'xcit_medium_24_p16_384_dist.pth')
model = dict(
    backbone=dict(
        arch='medium_24_p16', drop_path_rate=0.2, eta=1e-5,
        init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[512] * 4, out_channels=512),
    decode_head=dict(in_channels=[512] * 4))
