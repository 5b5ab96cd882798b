"""A whole Mask R-CNN as one traceable graph: image in, detections out.

mmdet's ``predict`` cannot be traced as it is: its post-processing branches
on data (``if inds.numel() > 0``, early returns for no boxes) and calls
mmcv's compiled NMS and RoIAlign. :class:`DetectorGraph` runs the model's
own modules (data preprocessor settings, ``extract_feat``, the RPN head, the
anchor generator, the box coders, the RoI extractors' level mapping, the box
and mask heads) and writes out only that post-processing, branch-free, with
the operators ONNX has: ``torchvision.ops.nms`` (``NonMaxSuppression``) and
``torchvision.ops.roi_align`` (``RoiAlign``, ``half_pixel`` for mmcv's
``aligned=True``). Each step cites the mmdet 3.3 function it reproduces;
``verify_detections`` checks the result against mmdet's ``predict``.
"""
from typing import Dict, List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.ops import nms, roi_align

from ..errors import UserError
from .graphs import input_channels, json_text, model_metadata, normalised


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor,
                groups: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Indices kept by NMS within each group, best score first: mmcv's
    ``batched_nms`` (the boxes of each group shifted apart by the largest
    coordinate plus one, one NMS over all), which mmdet uses below 10000
    boxes. A zero joins the coordinates so that no boxes (nothing above the
    score threshold) give no indices rather than an error."""
    largest = torch.cat([boxes.reshape(-1), boxes.new_zeros(1)]).max()
    offsets = groups.to(boxes) * (largest + 1)
    return nms(boxes + offsets[:, None], scores, iou_threshold)


def objectness_logits(rpn_head: nn.Module,
                      scores: torch.Tensor) -> torch.Tensor:
    """What the RPN ranks anchors by, ``(A,)`` from its ``(A, channels)``
    classifier outputs: the logit (a sigmoid head), or the foreground
    logit minus the background one (a softmax head of two channels, whose
    foreground probability is the sigmoid of that difference).

    mmdet ranks by the probability, ``sigmoid(logit)``; the logit orders the
    anchors the same way wherever the probabilities differ, and no rounding
    is involved. A runtime's ``Sigmoid`` is an approximation that
    saturates: onnxruntime returns exactly 0 below a logit of about -18 and
    is not monotonic around -16, where PyTorch's float32 sigmoid still keeps
    values like 4.3e-15 and 1.2e-18 apart. NMS breaks the resulting false
    ties by index and suppresses the wrong proposal, and a confident
    detection built on it disappears. Where PyTorch's own float32
    probabilities tie (logits within about 1e-3 of each other near 9; every
    logit above 16.7 gives exactly 1.0) mmdet leaves the order to its sort,
    and so may the graph."""
    if rpn_head.use_sigmoid_cls:
        return scores.reshape(-1)
    return scores[:, 0] - scores[:, 1]


def roi_features(extractor: nn.Module, feats: Tuple[torch.Tensor, ...],
                 rois: torch.Tensor) -> torch.Tensor:
    """mmdet's ``SingleRoIExtractor.forward`` without its data-dependent
    branches: each RoI pooled from the level ``map_roi_levels`` gives it,
    with each level's RoIAlign settings (size, scale, sampling, aligned)."""
    feats = feats[:extractor.num_inputs]
    layers = extractor.roi_layers
    out = feats[0].new_zeros(rois.shape[0], extractor.out_channels,
                             *layers[0].output_size)
    levels = extractor.map_roi_levels(rois, len(feats)) if len(feats) > 1 \
        else torch.zeros_like(rois[:, 0], dtype=torch.long)
    for i, (feat, layer) in enumerate(zip(feats, layers)):
        inds = (levels == i).nonzero().squeeze(1)
        pooled = roi_align(feat, rois[inds], layer.output_size,
                           layer.spatial_scale, layer.sampling_ratio,
                           layer.aligned)
        out = out.index_copy(0, inds, pooled)
    return out


class DetectorGraph(nn.Module):
    """Mask R-CNN (mmdet's ``TwoStageDetector`` with ``RPNHead``,
    ``StandardRoIHead`` and an FCN mask head) from image to detections, for
    one image: pixel values ``(1, 3, H, W)`` as ``LoadImageFromFile`` and
    the test pipeline's ``Resize`` give them in; ``boxes (K, 4)`` (x1, y1,
    x2, y2 in the input's pixels), ``scores (K,)``, ``labels (K,)`` and
    ``mask_probs (K, M, M)`` (the mask head's probabilities for each box's
    label, ``M`` = 28) out, best score first, K at most the config's
    ``max_per_img``. Masks leave the graph as the head's probabilities:
    pasting them into the image (:func:`~xcit_dense.deploy.masks.paste_masks`)
    touches only each box's pixels, while full-image masks would make the
    graph write and return ``K x H x W`` values."""
    output_names = ['boxes', 'scores', 'labels', 'mask_probs']
    takes_images = True

    def __init__(self, detector: nn.Module):
        super().__init__()
        check_exportable(detector)
        self.model = detector
        self.in_channels = input_channels(detector)

    def metadata(self) -> Dict[str, str]:
        """What the exported file records for running it without the mm
        model (:class:`~xcit_dense.deploy.ExportedDetector`): class names and
        palette, the config's test pipeline and visualizer, the mask
        threshold."""
        return dict(model_metadata(self), **{
            'xcit_dense.mask_thr_binary': json_text(
                self.model.roi_head.test_cfg.mask_thr_binary)})

    def exported_parts(self) -> Dict[str, nn.Module]:
        """The modules the graph runs: the whole detector."""
        return {'model': self.model}

    def forward(self, image: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        height, width = image.shape[-2:]
        feats = self.model.extract_feat(self.preprocess(image))
        proposals = self.proposals(feats, (height, width))
        boxes, scores, labels = self.detections(feats, proposals,
                                                (height, width))
        return boxes, scores, labels, self.mask_probs(feats, boxes, labels)

    def preprocess(self, image: torch.Tensor) -> torch.Tensor:
        """mmdet's ``DetDataPreprocessor`` on one image: channel order,
        normalisation, then padding to a multiple of ``pad_size_divisor``
        with ``pad_value`` at the bottom and right."""
        pre = self.model.data_preprocessor
        x = normalised(pre, image)
        divisor = pre.pad_size_divisor
        if divisor > 1:
            # padded to (size + divisor - 1) // divisor * divisor: with
            # free height and width every later shape is then a multiple
            # of one symbol, which the tracer simplifies; the same padding
            # as (divisor - size % divisor) % divisor, whose remainders
            # make the detector's export take twice as long. (Non-negative
            # operands: ONNX's integer Div truncates.)
            height, width = x.shape[-2:]
            x = F.pad(x, (0, (width + divisor - 1) // divisor * divisor
                          - width,
                          0, (height + divisor - 1) // divisor * divisor
                          - height), value=float(pre.pad_value))
        return x

    def proposals(self, feats: Tuple[torch.Tensor, ...],
                  img_shape: Tuple[int, int]) -> torch.Tensor:
        """The RPN's proposals, ``(P, 4)``: ``RPNHead.predict_by_feat``
        (the best ``nms_pre`` anchors of each level, decoded and clipped to
        the image; boxes no larger than ``min_bbox_size`` dropped; NMS within
        each level; the best ``max_per_img``), ranked by
        :func:`objectness_logits`, which order the anchors as mmdet's
        probabilities do and which a runtime computes exactly."""
        head = self.model.rpn_head
        cfg = head.test_cfg
        cls_scores, bbox_preds = head(feats)
        priors = head.prior_generator.grid_priors(
            [c.shape[-2:] for c in cls_scores], dtype=cls_scores[0].dtype,
            device=cls_scores[0].device)
        nms_pre = cfg.get('nms_pre', -1)
        scores, deltas, anchors, levels = [], [], [], []
        for level, (cls, reg, prior) in enumerate(
                zip(cls_scores, bbox_preds, priors)):
            score = objectness_logits(
                head, cls[0].permute(1, 2, 0).reshape(
                    -1, head.cls_out_channels))
            delta = reg[0].permute(1, 2, 0).reshape(
                -1, head.bbox_coder.encode_size)
            if nms_pre > 0:
                score, best = score.topk(torch.sym_min(nms_pre,
                                                       score.shape[0]))
                delta, prior = delta[best], prior[best]
            scores.append(score)
            deltas.append(delta)
            anchors.append(prior)
            levels.append(torch.full_like(score, level, dtype=torch.long))
        boxes = head.bbox_coder.decode(torch.cat(anchors), torch.cat(deltas),
                                       max_shape=img_shape)
        scores, levels = torch.cat(scores), torch.cat(levels)
        if cfg.get('min_bbox_size', -1) >= 0:
            size = cfg.min_bbox_size
            valid = ((boxes[:, 2] - boxes[:, 0] > size) &
                     (boxes[:, 3] - boxes[:, 1] > size))
            boxes, scores, levels = boxes[valid], scores[valid], levels[valid]
        keep = batched_nms(boxes, scores, levels, cfg.nms.iou_threshold)
        return boxes[keep[:cfg.max_per_img]]

    def detections(self, feats: Tuple[torch.Tensor, ...],
                   proposals: torch.Tensor, img_shape: Tuple[int, int]
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Boxes, scores and labels: ``StandardRoIHead.predict_bbox`` and
        ``BBoxHead.predict_by_feat`` (softmax scores, class-specific boxes
        decoded from the proposals and clipped) with ``multiclass_nms``
        (scores above ``score_thr``, NMS within each class, the best
        ``max_per_img``)."""
        roi_head = self.model.roi_head
        head, cfg = roi_head.bbox_head, roi_head.test_cfg
        rois = torch.cat([proposals.new_zeros(proposals.shape[0], 1),
                          proposals], dim=1)
        cls_score, bbox_pred = head(
            roi_features(roi_head.bbox_roi_extractor, feats, rois))
        # Probabilities, as mmdet thresholds, ranks and returns them (the
        # scores are an output). A runtime's Exp / Softmax differs from
        # PyTorch's by a few units in the last place, never saturating
        # between score_thr (0.05) and 1: it can move an order or the
        # threshold only between scores that equal each other to ~1e-7,
        # which verify_detections accepts as ties (SCORE_RTOL).
        scores = F.softmax(cls_score, dim=-1)[:, :-1]
        classes = head.num_classes
        per_roi = 1 if head.reg_class_agnostic else classes
        # a spare row after the proposals (zero box, zero deltas, scores no
        # threshold passes): mmdet's delta2bbox returns early when there are
        # no boxes, a test on the data-dependent number of proposals that
        # torch.export cannot decide in PyTorch 2.11 (the GPU machine's);
        # with the spare row that number is never 0, and the threshold
        # drops the row
        size = head.bbox_coder.encode_size
        proposals = torch.cat([proposals, proposals.new_zeros(1, 4)])
        bbox_pred = torch.cat(
            [bbox_pred, bbox_pred.new_zeros(1, per_roi * size)])
        scores = torch.cat(
            [scores, scores.new_full((1, classes), float('-inf'))])
        boxes = head.bbox_coder.decode(
            proposals.repeat_interleave(per_roi, dim=0),
            bbox_pred.view(-1, size),
            max_shape=img_shape).view(-1, per_roi, 4)
        boxes = boxes.expand(-1, classes, 4).reshape(-1, 4)
        labels = torch.arange(classes, device=scores.device).expand_as(
            scores).reshape(-1)
        scores = scores.reshape(-1)
        valid = scores > cfg.score_thr
        boxes, scores, labels = boxes[valid], scores[valid], labels[valid]
        keep = batched_nms(boxes, scores, labels,
                           cfg.nms.iou_threshold)[:cfg.max_per_img]
        return boxes[keep], scores[keep], labels[keep]

    def mask_probs(self, feats: Tuple[torch.Tensor, ...], boxes: torch.Tensor,
                   labels: torch.Tensor) -> torch.Tensor:
        """Each box's mask probabilities for its label, ``(K, M, M)``:
        ``StandardRoIHead._mask_forward`` and the sigmoid of
        ``FCNMaskHead.predict_by_feat``, before pasting."""
        roi_head = self.model.roi_head
        rois = torch.cat([boxes.new_zeros(boxes.shape[0], 1), boxes], dim=1)
        preds = roi_head.mask_head(
            roi_features(roi_head.mask_roi_extractor, feats, rois))
        if roi_head.mask_head.class_agnostic:
            preds = preds[:, 0]
        else:
            preds = preds[torch.arange(preds.shape[0]), labels]
        # leave the graph as probabilities, thresholded at mask_thr_binary
        # (0.5, a logit of 0) when pasted: a runtime's Sigmoid saturates far
        # from there, and pixels within PROB_ATOL of it are ties to
        # verify_detections; nothing is ranked by them
        return preds.sigmoid()


#: what the graph writes out, by the mmdet class it reproduces
SUPPORTED = {
    'detector': ('TwoStageDetector', ),
    'rpn_head': ('RPNHead', ),
    'roi_head': ('StandardRoIHead', ),
    'roi_extractor': ('SingleRoIExtractor', ),
    'bbox_coder': ('DeltaXYWHBBoxCoder', ),
    'mask_head': ('FCNMaskHead', ),
}


def _is(obj, names) -> bool:
    return any(c.__name__ in names for c in type(obj).__mro__)


def check_exportable(detector: nn.Module) -> None:
    """Raise a :class:`UserError` naming what the whole-detector graph does
    not reproduce: anything but Mask R-CNN's heads (RPN, one box stage,
    FCN mask head), RoI pooling other than average RoIAlign, NMS other than
    plain ``nms``, a shared head, or a test-time setting mmdet reads from
    elsewhere."""
    problems: List[str] = []
    roi_head = getattr(detector, 'roi_head', None)
    rpn_head = getattr(detector, 'rpn_head', None)
    if not _is(detector, SUPPORTED['detector']) or rpn_head is None or \
            roi_head is None:
        problems.append(f'the detector is a {type(detector).__name__} '
                        'without an RPN and RoI head')
    else:
        if not _is(rpn_head, SUPPORTED['rpn_head']):
            problems.append(f'rpn_head is a {type(rpn_head).__name__}')
        elif rpn_head.num_classes != 1:
            problems.append(f'rpn_head has {rpn_head.num_classes} classes '
                            '(an RPN has one: object)')
        if type(roi_head).__name__ not in SUPPORTED['roi_head']:
            problems.append(f'roi_head is a {type(roi_head).__name__}')
        elif roi_head.with_shared_head or not roi_head.with_mask:
            problems.append('the RoI head has a shared head or no mask head')
        else:
            for name in ('bbox_roi_extractor', 'mask_roi_extractor'):
                problems += _roi_extractor_problems(
                    name, getattr(roi_head, name))
            coders = [('rpn_head', rpn_head.bbox_coder),
                      ('roi_head.bbox_head', roi_head.bbox_head.bbox_coder)]
            for where, coder in coders:
                if type(coder).__name__ not in SUPPORTED['bbox_coder']:
                    problems.append(f'{where} decodes boxes with a '
                                    f'{type(coder).__name__}')
            if roi_head.bbox_head.custom_cls_channels:
                problems.append('the box head has a custom classifier '
                                'activation')
            if not _is(roi_head.mask_head, SUPPORTED['mask_head']):
                problems.append(
                    f'mask_head is a {type(roi_head.mask_head).__name__}')
            for where, cfg in (('rpn', rpn_head.test_cfg),
                               ('rcnn', roi_head.test_cfg)):
                nms_type = cfg.nms.get('type', 'nms')
                if nms_type != 'nms':
                    problems.append(f'test_cfg.{where}.nms is {nms_type}')
    if problems:
        raise UserError(
            'The whole-detector export reproduces Mask R-CNN (mmdet\'s '
            'TwoStageDetector with RPNHead, StandardRoIHead, '
            'SingleRoIExtractor with average RoIAlign, DeltaXYWHBBoxCoder, '
            'FCNMaskHead, plain NMS); this model differs: '
            + '; '.join(problems) + '. Export its backbone and neck with '
            '--backbone-and-neck, or its backbone with --backbone-only.')


def _roi_extractor_problems(name: str, extractor: nn.Module) -> List[str]:
    if not _is(extractor, SUPPORTED['roi_extractor']):
        return [f'{name} is a {type(extractor).__name__}']
    problems = []
    for layer in extractor.roi_layers:
        if type(layer).__name__ != 'RoIAlign' or \
                getattr(layer, 'pool_mode', 'avg') != 'avg':
            problems.append(f'{name} pools with {type(layer).__name__} '
                            f'({getattr(layer, "pool_mode", "")})')
            break
    return problems
