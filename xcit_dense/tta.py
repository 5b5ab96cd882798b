"""Test-time augmentation for instance segmentation.

mmdet 3.3's ``DetTTAModel`` merges the boxes of flipped and rescaled views
(each view's boxes mapped back to the original image, then NMS within each
class) and refuses masks ("TTA of instance segmentation does not support
now"). :class:`InstanceSegTTAModel` merges boxes exactly as it does and
carries the masks along: each view's masks (pasted at the original size by
the detector's ``predict``) are flipped back, and each detection kept by
the NMS takes the score-weighted vote of the masks of the same object in
every view (same label, box IoU at least ``mask_vote_iou``, default 0.5): a
pixel is in the mask when the views holding it carry at least half of the
score.
"""
from typing import List

import torch
from mmcv.ops import batched_nms
from mmdet.models.test_time_augs import DetTTAModel
from mmdet.structures import DetDataSample
from mmengine.structures import InstanceData
from torchvision.ops import box_iou

from .registry import MODELS


def unflip_masks(masks: torch.Tensor, meta: dict) -> torch.Tensor:
    """``(N, H, W)`` masks of a flipped view in the original image's
    orientation."""
    if not meta.get('flip'):
        return masks
    dims = {'horizontal': [-1], 'vertical': [-2],
            'diagonal': [-2, -1]}[meta['flip_direction']]
    return masks.flip(dims)


def vote_masks(masks: torch.Tensor, boxes: torch.Tensor,
               scores: torch.Tensor, labels: torch.Tensor,
               keep: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """For each kept detection, the pixels its object's masks in all views
    (same label, box IoU >= ``iou_threshold``, itself included) cover with
    at least half of their summed score."""
    same = (box_iou(boxes[keep], boxes) >= iou_threshold) & \
        (labels[keep][:, None] == labels[None])
    weights = same.float() * scores[None]
    votes = torch.einsum('kn,nhw->khw', weights, masks.float())
    return votes >= 0.5 * weights.sum(dim=1)[:, None, None]


@MODELS.register_module()
class InstanceSegTTAModel(DetTTAModel):
    """``DetTTAModel`` for detectors that predict masks (Mask R-CNN,
    Cascade Mask R-CNN); without masks it is ``DetTTAModel``. ``tta_cfg``:
    ``nms`` and ``max_per_img`` as mmdet's, and ``mask_vote_iou``."""

    def test_step(self, data):
        """Predict every view, then merge. The views reach the detector
        without their flip flag: mmdet 3.3's ``CascadeRoIHead.predict_mask``
        would otherwise pass each stage's mask logits of a flipped view to
        ``merge_aug_masks``, which reverses them with a negative-step slice
        that torch tensors do not support ("step must be greater than
        zero"); a view's masks belong to its own, flipped image anyway, and
        are flipped back here after pasting."""
        views = [{key: value[i] for key, value in data.items()}
                 for i in range(len(data['inputs']))]
        flips = [[dict(flip=s.metainfo.get('flip', False),
                       flip_direction=s.metainfo.get('flip_direction'))
                  for s in view['data_samples']] for view in views]
        for view in views:
            for sample in view['data_samples']:
                sample.set_metainfo(dict(flip=False))
        predictions = [self.module.test_step(view) for view in views]
        for samples, flip in zip(predictions, flips):
            for sample, meta in zip(samples, flip):
                sample.set_metainfo(meta)
        return self.merge_preds(list(zip(*predictions)))

    def _merge_single_sample(
            self, data_samples: List[DetDataSample]) -> DetDataSample:
        if data_samples[0].pred_instances.get('masks', None) is None:
            return super()._merge_single_sample(data_samples)
        preds = [s.pred_instances for s in data_samples]
        metas = [s.metainfo for s in data_samples]
        boxes, scores = self.merge_aug_bboxes(
            [p.bboxes for p in preds], [p.scores for p in preds], metas)
        labels = torch.cat([p.labels for p in preds])
        if boxes.numel() == 0:
            return data_samples[0]
        masks = torch.cat([unflip_masks(p.masks, m)
                           for p, m in zip(preds, metas)])
        dets, keep = batched_nms(boxes, scores, labels, self.tta_cfg.nms)
        limit = self.tta_cfg.max_per_img
        dets, keep = dets[:limit], keep[:limit]
        merged = data_samples[0]
        merged.pred_instances = InstanceData(
            bboxes=dets[:, :-1], scores=dets[:, -1], labels=labels[keep],
            masks=vote_masks(masks, boxes, scores, labels, keep,
                             self.tta_cfg.get('mask_vote_iou', 0.5)))
        return merged
