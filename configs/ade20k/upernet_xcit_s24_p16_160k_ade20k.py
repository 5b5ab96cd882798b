# UperNet XCiT-S24/16, 160k ADE20K. Published mIoU: 46.9
# (facebookresearch/xcit semantic segmentation README).
_base_ = './_base_/upernet_xcit_160k_ade20k.py'

# ImageNet-1k weights of the published training command (384 px, distilled)
pretrained = ('https://dl.fbaipublicfiles.com/xcit/'
              'xcit_small_24_p16_384_dist.pth')
model = dict(
    backbone=dict(
        arch='small_24_p16', drop_path_rate=0.1, eta=1e-5,
        init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[384] * 4),
    auxiliary_head=dict(in_channels=384))
