# UperNet XCiT-S12/16 tested multi-scale (0.5 to 1.75 x (2048, 512)) with
# horizontal flip, mmseg's test-time augmentation. The same lines on top of
# any other ADE20K config give its multi-scale-with-flip test:
#   python tools/test.py configs/ade20k/upernet_xcit_s12_ms_flip.py CKPT
_base_ = './upernet_xcit_s12_p16_160k_ade20k.py'

model = dict(_delete_=True, type='SegTTAModel', module={{_base_.model}})
test_dataloader = dict(dataset=dict(pipeline={{_base_.tta_pipeline}}))
