# Short name for UperNet XCiT-S12/16, 160k ADE20K (published mIoU: 45.9).
_base_ = './upernet_xcit_s12_p16_160k_ade20k.py'
