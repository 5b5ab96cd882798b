# Test-time augmentation of the COCO instance-segmentation recipes
# (tools/test.py --tta, as mmdet's): the image at three scales, each as it is
# and flipped; boxes merged as mmdet's DetTTAModel merges them, masks by a
# score-weighted vote (xcit_dense/tta.py; a recipe inheriting this file
# imports xcit_dense.tta in its custom_imports).
tta_model = dict(
    type='xcit_dense.InstanceSegTTAModel',
    tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5), max_per_img=100))
tta_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='TestTimeAug',
         transforms=[
             [dict(type='Resize', scale=(1333, s), keep_ratio=True)
              for s in (640, 800, 960)],
             [dict(type='RandomFlip', prob=1.),
              dict(type='RandomFlip', prob=0.)],
             [dict(type='PackDetInputs',
                   meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                              'scale_factor', 'flip', 'flip_direction'))],
         ]),
]
