# Semantic FPN XCiT-S24/16, 80k ADE20K. Published mIoU: 44.6
# (facebookresearch/xcit semantic segmentation README).
_base_ = './_base_/sem_fpn_xcit_80k_ade20k.py'

model = dict(
    backbone=dict(
        arch='small_24_p16', drop_path_rate=0.1, eta=1e-5,
        init_cfg=dict(checkpoint='pretrained/xcit_small_24_p16_224.pth')),
    neck=dict(in_channels=[384] * 4, out_channels=384),
    decode_head=dict(in_channels=[384] * 4))
