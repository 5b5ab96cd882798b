"""Check an exported detector against mmdet's own ``predict``.

Detections are matched one to one (same label, box IoU at least
:data:`BOX_IOU`, score within :data:`SCORE_RTOL`), and each matched pair's
masks, pasted at the image's size, must overlap by :data:`MASK_IOU`. Where
PyTorch's own choice is a tie, a difference is allowed: mask pixels whose
probability is within :data:`PROB_ATOL` of the mask threshold count for
neither mask, and a detection may go without a partner when its score
equals (within :data:`SCORE_RTOL`) the score threshold, the last score kept
under ``max_per_img``, or the score of another detection of its label.
"""
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch
from torchvision.ops import box_iou

from ..errors import ExportError
from ..models.policy import fast_path
from .masks import paste_masks, paste_probs

BOX_IOU = 0.99
SCORE_RTOL = 1e-4
MASK_IOU = 0.98
#: mask pixels whose pasted probability is this close to the threshold tie
PROB_ATOL = 1e-4


def mmdet_predict(detector: torch.nn.Module, image: torch.Tensor) -> Dict:
    """mmdet's ``test_step`` on one image ``(1, 3, H, W)`` of pixel values,
    taken as the test pipeline's output (no further resizing): boxes,
    scores, labels and masks as tensors."""
    from mmdet.structures import DetDataSample
    height, width = image.shape[-2:]
    sample = DetDataSample(metainfo=dict(
        img_shape=(height, width), ori_shape=(height, width),
        scale_factor=(1., 1.)))
    with fast_path(False), torch.no_grad():
        result = detector.test_step(dict(
            inputs=[image[0].round().clamp(0, 255).to(torch.uint8)],
            data_samples=[sample]))[0].pred_instances
    return dict(boxes=result.bboxes, scores=result.scores,
                labels=result.labels, masks=result.masks)


def compare_detections(outputs: Sequence[np.ndarray], reference: Dict,
                       size: Tuple[int, int], score_thr: float,
                       max_per_img: int, mask_thr: float) -> Dict:
    """One row of the check: how many detections each side has, how many
    matched, how many went unmatched at a tie, and the worst box IoU, score
    difference and mask IoU among the matches. Raises :class:`ExportError`
    for an unmatched detection that is not at a tie, or a matched pair whose
    masks differ."""
    exported = dict(zip(('boxes', 'scores', 'labels', 'probs'),
                        (torch.from_numpy(np.asarray(o)) for o in outputs)))
    iou, pairs = _match(reference, exported)
    ties = _count_ties(reference, exported, pairs, size, score_thr,
                       max_per_img)
    row = dict(size=tuple(size), detections=len(reference['boxes']),
               exported=len(exported['boxes']), matched=len(pairs),
               ties=ties, min_box_iou=1.0, max_score_rel_diff=0.0,
               min_mask_iou=1.0)
    if pairs:
        row.update(_matched_pairs(reference, exported, iou, pairs, size,
                                  mask_thr))
    return row


def _match(reference: Dict, exported: Dict):
    """The box IoU matrix and the pairs ``(reference, exported)``, each
    reference detection (best score first) taking the first free exported
    one of its label with a close score and box."""
    ref_boxes, ref_scores = reference['boxes'], reference['scores']
    boxes, scores = exported['boxes'], exported['scores']
    iou = box_iou(ref_boxes, boxes) if len(boxes) and len(ref_boxes) else \
        torch.zeros(len(ref_boxes), len(boxes))
    close = ((ref_scores[:, None] - scores[None, :]).abs()
             <= SCORE_RTOL * ref_scores.abs()[:, None].clamp(min=1e-12))
    candidates = (iou >= BOX_IOU) & close & \
        (reference['labels'][:, None] == exported['labels'][None, :])
    pairs, taken = [], set()
    for i in range(len(ref_boxes)):
        for j in candidates[i].nonzero().flatten().tolist():
            if j not in taken:
                pairs.append((i, j))
                taken.add(j)
                break
    return iou, pairs


def _count_ties(reference: Dict, exported: Dict, pairs, size, score_thr,
                max_per_img) -> int:
    """How many detections went without a partner, each at a score tie;
    raises :class:`ExportError` for the first that is not."""
    matched_ref = {i for i, _ in pairs}
    matched_exp = {j for _, j in pairs}
    unmatched = ([('PyTorch', reference, k)
                  for k in range(len(reference['boxes']))
                  if k not in matched_ref] +
                 [('onnxruntime', exported, k)
                  for k in range(len(exported['boxes']))
                  if k not in matched_exp])
    for side, found, k in unmatched:
        score, label = float(found['scores'][k]), int(found['labels'][k])
        if not _at_a_tie(score, label, reference['scores'],
                         reference['labels'], score_thr, max_per_img,
                         exclude=k if side == 'PyTorch' else None):
            box = [round(v, 1) for v in found['boxes'][k].tolist()]
            raise ExportError(
                f'The exported detector is wrong: at {size[0]}x{size[1]} '
                f'{side} finds an object the other does not (label {label}, '
                f'score {score:.6f}, box {box}), and its score ties with '
                'nothing that would explain it.')
    return len(unmatched)


def _matched_pairs(reference: Dict, exported: Dict, iou: torch.Tensor,
                   pairs, size, mask_thr: float) -> Dict:
    """The worst box IoU, score difference and mask IoU of the matched
    pairs; raises :class:`ExportError` when a mask IoU is below
    :data:`MASK_IOU`."""
    ri, oi = (torch.tensor(v) for v in zip(*pairs))
    ref_scores, probs, boxes = (reference['scores'], exported['probs'][oi],
                                exported['boxes'][oi])
    masks = paste_masks(probs, boxes, *size, mask_thr)
    # pixels whose probability ties with the threshold count for neither
    settled = (paste_probs(probs, boxes, *size) - mask_thr).abs() > PROB_ATOL
    stats = dict(
        min_box_iou=float(iou[ri, oi].min()),
        max_score_rel_diff=float(
            ((ref_scores[ri] - exported['scores'][oi]).abs() /
             ref_scores[ri].abs().clamp(min=1e-12)).max()),
        min_mask_iou=min(_mask_iou(a & s, b & s) for a, b, s in
                         zip(reference['masks'][ri], masks, settled)))
    if stats['min_mask_iou'] < MASK_IOU:
        raise ExportError(
            f'The exported detector is wrong: at {size[0]}x{size[1]} a '
            f'mask overlaps PyTorch\'s by IoU {stats["min_mask_iou"]:.3f}; '
            f'at least {MASK_IOU} is required.')
    return stats


def _at_a_tie(score: float, label: int, ref_scores: torch.Tensor,
              ref_labels: torch.Tensor, score_thr: float, max_per_img: int,
              exclude) -> bool:
    def ties(other: float) -> bool:
        return abs(score - other) <= SCORE_RTOL * max(abs(score), 1e-12)
    if ties(score_thr):
        return True
    if len(ref_scores) >= max_per_img and ties(float(ref_scores[-1])):
        return True
    same = [float(s) for k, (s, lab) in enumerate(zip(ref_scores, ref_labels))
            if int(lab) == label and k != exclude]
    return any(ties(s) for s in same)


def _mask_iou(a: torch.Tensor, b: torch.Tensor) -> float:
    union = int((a | b).sum())
    return 1.0 if union == 0 else int((a & b).sum()) / union


def describe(row: Dict) -> str:
    """The log line of a row."""
    text = (f'{row["matched"]} of {row["detections"]} detections matched')
    if row['ties']:
        text += f', {row["ties"]} unmatched at score ties'
    if row['matched']:
        text += (f'; box IoU >= {row["min_box_iou"]:.4f}, scores within '
                 f'{row["max_score_rel_diff"]:.1e}, mask IoU >= '
                 f'{row["min_mask_iou"]:.3f}')
    return text


def verify_detections(session, graph, images: Sequence[torch.Tensor],
                      log=print) -> List[Dict]:
    """Run the exported detector (an onnxruntime ``session``) and mmdet's
    ``predict`` on each of ``images`` (pixel values ``(1, 3, H, W)``); one
    row per image (see :func:`compare_detections`)."""
    roi_cfg = graph.model.roi_head.test_cfg
    name = session.get_inputs()[0].name
    rows = []
    for image in images:
        height, width = image.shape[-2:]
        reference = mmdet_predict(graph.model, image)
        outputs = session.run(None, {name: image.numpy()})
        row = compare_detections(outputs, reference, (height, width),
                                 roi_cfg.score_thr, roi_cfg.max_per_img,
                                 roi_cfg.mask_thr_binary)
        rows.append(row)
        log(f'  onnxruntime vs mmdet predict at {height}x{width}: '
            + describe(row))
    if not any(r['detections'] for r in rows):
        log('  (mmdet predicts no object on these check images: only the '
            'empty result was compared)')
    return rows
