# Short name for Mask R-CNN XCiT-S12/16, 3x COCO (published box / mask AP:
# 45.3 / 40.8).
_base_ = './mask_rcnn_xcit_s12_p16_3x_coco.py'
