# Semantic FPN XCiT-S12/16, 80k ADE20K. Published mIoU: 43.9
# (facebookresearch/xcit semantic segmentation README).
_base_ = './_base_/sem_fpn_xcit_80k_ade20k.py'

model = dict(
    backbone=dict(
        arch='small_12_p16', drop_path_rate=0.05, eta=1.0,
        init_cfg=dict(checkpoint='pretrained/xcit_small_12_p16_224.pth')),
    neck=dict(in_channels=[384] * 4, out_channels=384),
    decode_head=dict(in_channels=[384] * 4))
