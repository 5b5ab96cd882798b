"""Detection test-time augmentation (xcit_dense/tta.py, tools/test.py
--tta): boxes merged as mmdet's DetTTAModel merges them, masks flipped back
and voted; the recipes' TTA through tools/test.py on the tiny COCO data."""
import re

import pytest
import torch
from mmdet.models.test_time_augs import DetTTAModel
from mmdet.structures import DetDataSample
from mmengine.config import ConfigDict
from mmengine.structures import InstanceData

from xcit_dense.tta import InstanceSegTTAModel

from conftest import REPO
from shrink import NARROW_HEAD
from test_export_detector import MASK_RCNN, TINY
from tool_runs import run_tool_here

H, W = 20, 30


class Predictor(torch.nn.Module):
    """What BaseTTAModel wraps: a model with ``test_step`` (not run
    here: the views' predictions are given)."""

    def test_step(self, data):
        raise AssertionError('not called')
CFG = ConfigDict(nms=dict(type='nms', iou_threshold=0.5), max_per_img=100)


def view(boxes, scores, labels, masks, flip):
    sample = DetDataSample(metainfo=dict(
        ori_shape=(H, W), flip=flip,
        flip_direction='horizontal' if flip else None))
    sample.pred_instances = InstanceData(
        bboxes=torch.tensor(boxes, dtype=torch.float32),
        scores=torch.tensor(scores), labels=torch.tensor(labels),
        masks=masks)
    return sample


def box_mask(x0, y0, x1, y1):
    mask = torch.zeros(H, W, dtype=torch.bool)
    mask[y0:y1, x0:x1] = True
    return mask


def test_flipped_views_merge_like_mmdet_and_vote_masks():
    # one object seen in both views (the flipped view mirrors it), one only
    # in the plain view
    def views(with_masks=True):
        plain = view([[2., 3., 12., 13.], [20., 5., 28., 15.]], [0.9, 0.6],
                     [0, 1], torch.stack([box_mask(2, 3, 12, 13),
                                          box_mask(20, 5, 28, 15)]), False)
        mirrored = box_mask(2, 3, 11, 13).flip(-1)  # one column narrower
        flipped = view([[W - 12., 3., W - 2., 13.]], [0.8], [0],
                       mirrored[None], True)
        if not with_masks:
            del plain.pred_instances.masks, flipped.pred_instances.masks
        return [plain, flipped]
    ours = InstanceSegTTAModel(module=Predictor(), tta_cfg=CFG)
    merged = ours.merge_preds([views()])[0].pred_instances
    theirs = DetTTAModel(module=Predictor(), tta_cfg=CFG)
    reference = theirs.merge_preds([views(False)])[0].pred_instances
    for key in ('bboxes', 'scores', 'labels'):
        assert torch.equal(merged[key], reference[key]), key
    assert merged.masks.shape == (2, H, W)
    # the two views' masks of object 0 (scores 0.9, 0.8), flipped back: the
    # column only the plain view holds carries 0.9 / 1.7 >= 1/2 of the score
    assert torch.equal(merged.masks[0], box_mask(2, 3, 12, 13))
    assert torch.equal(merged.masks[1], box_mask(20, 5, 28, 15))
    # a column that only the weaker view held would be dropped
    weak = view([[2., 3., 12., 13.]], [0.3], [0], box_mask(2, 3, 13, 13)[None],
                False)
    voted = ours.merge_preds([[views()[0], weak]])[0].pred_instances
    assert torch.equal(voted.masks[0], box_mask(2, 3, 12, 13))


CASCADE = f"""
_base_ = r'{REPO}/configs/coco/demo_cascade_mask_rcnn_xcit_nano_synthetic.py'
model = dict(
    backbone=dict({', '.join(f'{k}={v!r}' for k, v in TINY.items())}),
    neck=dict(in_channels=[32] * 4, out_channels=16),
    rpn_head=dict(in_channels=16, feat_channels=16),
    roi_head=dict(bbox_roi_extractor=dict(out_channels=16),
                  mask_roi_extractor=dict(out_channels=16),
                  mask_head=dict(in_channels=16, conv_out_channels=16)),
    # fewer proposals and detections: the mask heads of three stages run
    # on each detection of each of the six views
    test_cfg=dict(rpn=dict(nms_pre=100, max_per_img=20),
                  rcnn=dict(max_per_img=10)))
"""
#: the heads' options on the command line (the cascade's box heads are a
#: list, which a config merges whole): each stage's box head 16 wide, as
#: MASK_RCNN's (the widths of 128 took half of the test's time)
OPTIONS = {'cascade': {
    f'model.roi_head.bbox_head.{stage}.{key}': width for stage in range(3)
    for key, width in (('in_channels', 16), ('conv_out_channels', 16),
                       ('fc_out_channels', 32))}}


MASK2FORMER = f"""
_base_ = r'{REPO}/configs/coco/demo_mask2former_xcit_nano_synthetic.py'
model = dict(
    backbone=dict({', '.join(f'{k}={v!r}' for k, v in TINY.items())}),
    panoptic_head=dict(in_channels=[32] * 4, num_queries=10,
                       {NARROW_HEAD})
"""
HEADS = {'mask_rcnn': MASK_RCNN, 'cascade': CASCADE,
         'mask2former': MASK2FORMER}


def perfect_views(ann_file):
    """``merge_preds`` of :class:`InstanceSegTTAModel` on what a perfect
    detector predicts in each view: the image's annotated boxes, labels and
    masks (at its original size, as the detector's ``predict`` pastes them),
    mirrored where the view is flipped, each with score 1."""
    from pycocotools.coco import COCO
    coco = COCO(ann_file)
    label_of = {c: i for i, c in enumerate(sorted(coco.getCatIds()))}
    merge = InstanceSegTTAModel.merge_preds

    def truth(meta):
        anns = coco.loadAnns(coco.getAnnIds(imgIds=meta['img_id']))
        h, w = meta['ori_shape']
        boxes = torch.tensor([[x, y, x + bw, y + bh] for x, y, bw, bh in
                              (a['bbox'] for a in anns)]).view(-1, 4)
        masks = torch.stack([torch.from_numpy(coco.annToMask(a)).bool()
                             for a in anns]) if anns else \
            torch.zeros(0, h, w, dtype=torch.bool)
        if meta.get('flip'):
            assert meta['flip_direction'] == 'horizontal'
            boxes = torch.stack([w - boxes[:, 2], boxes[:, 1],
                                 w - boxes[:, 0], boxes[:, 3]], dim=1)
            masks = masks.flip(-1)
        return InstanceData(
            bboxes=boxes.float(), masks=masks, scores=torch.ones(len(anns)),
            labels=torch.tensor([label_of[a['category_id']] for a in anns],
                                dtype=torch.long))

    def merge_preds(self, data_samples_list):
        for views in data_samples_list:
            for view in views:
                view.pred_instances = truth(view.metainfo)
        return merge(self, data_samples_list)
    return merge_preds


@pytest.mark.parametrize('head', HEADS)
def test_test_tool_tta(tmp_path, tiny_coco, head, monkeypatch):
    """The demo's TTA (three scales, flipped and not) through tools/test.py
    --tta, for Mask R-CNN, Cascade Mask R-CNN (whose mask head mmdet would
    try to unflip itself, failing) and Mask2Former: the detector predicts
    every view; merged from a perfect detector's predictions of each view
    (the untrained detector's own score about 0), the boxes and masks score
    the perfect COCO mAP (a flipped view's masks left mirrored: 0.11)."""
    config = tmp_path / 'tta.py'
    config.write_text(HEADS[head] + f"""
data_root = '{tiny_coco}/'
test_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                       dataset=dict(data_root=data_root))
test_evaluator = dict(ann_file=data_root + 'annotations/val.json')
""")
    from mmengine.config import Config

    from xcit_dense.inference import init_model
    options = OPTIONS.get(head, {})
    cfg = Config.fromfile(str(config))
    cfg.merge_from_dict(options)
    torch.manual_seed(0)
    model = init_model(cfg, None)
    checkpoint = tmp_path / 'model.pth'
    torch.save(dict(state_dict=model.state_dict(), meta={}), checkpoint)
    monkeypatch.setattr(InstanceSegTTAModel, 'merge_preds', perfect_views(
        f'{tiny_coco}/annotations/val.json'))
    proc = run_tool_here('tools/test.py', config, checkpoint, '--tta',
                         '--work-dir', tmp_path / 'work', *(
                             ['--cfg-options'] if options else []),
                         *(f'{k}={v}' for k, v in options.items()))
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores = dict(re.findall(r'coco/(bbox|segm)_mAP: ([\d.]+)',
                             proc.stdout + proc.stderr))
    assert scores.keys() == {'bbox', 'segm'}, scores
    assert all(float(v) > 0.9 for v in scores.values()), scores
    monkeypatch.undo()
    # a config without TTA settings: one paragraph
    bare = tmp_path / 'bare.py'
    bare.write_text("_base_ = './tta.py'\ntta_model = None\n")
    proc = run_tool_here('tools/test.py', bare, checkpoint, '--tta',
                         '--work-dir', tmp_path / 'bare_work')
    assert proc.returncode == 1
    assert proc.stderr.startswith('error: --tta needs tta_model in the '
                                  'config')
