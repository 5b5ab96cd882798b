"""What an INT8 file loses against its fp32 file: the task's metric of both
files on held-out images of the config's test dataset (never the
calibration ones), as ``tools/test.py`` measures an exported file.

* A detector: mmdet's COCO bbox and segm mAP (the config's
  ``test_evaluator``, a ``CocoMetric``, against its annotation file), both
  gated: the masks come from quantized layers too.
* A segmentor: mmseg's mIoU (the config's ``test_evaluator``, an
  ``IoUMetric``, against the label maps its test pipeline loads).
* Where the config has no annotated test data (no ``test_evaluator`` of
  those, ``format_only``, an annotation file without annotations, a test
  pipeline that loads no label maps), the fp32 file's predictions are the
  ground truth: its detections scoring at least :data:`REFERENCE_SCORE`
  (boxes, labels, masks), or its label maps. The fp32 file scores 100
  against them by construction, and the INT8 file's figure says how far
  its predictions are from the fp32 file's.

Figures are in points (mAP x 100, mIoU as mmseg gives it, in percent).
"""
import contextlib
import copy
import io
import logging
import numbers
from typing import Dict, List, Sequence

from ..errors import ExportError

#: the figures the tolerance applies to, by toolkit (suffixes of the
#: metric's keys, e.g. ``coco/bbox_mAP``), and what each is in points of
GATED = {'mmdet': ('bbox_mAP', 'segm_mAP'), 'mmseg': ('mIoU', )}
IN_POINTS = {'bbox_mAP': 100, 'segm_mAP': 100, 'mIoU': 1}
#: the fp32 detections that are the reference's objects without annotations
REFERENCE_SCORE = 0.5


@contextlib.contextmanager
def quiet():
    """Without mmengine's info log and pycocotools' printing (which loads
    an annotation file and evaluates with several screens of it)."""
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def annotated_evaluator(cfg, scope: str, sample):
    """The config's ``test_evaluator`` built, when it measures the task's
    metric against annotations of the test data (``sample``, one item of
    the test dataset, tells whether the pipeline loads label maps);
    otherwise None and why."""
    from mmengine.evaluator import Evaluator
    metric_cfg = cfg.get('test_evaluator')
    if not metric_cfg:
        return None, 'the config has no test_evaluator'
    metrics = metric_cfg if isinstance(metric_cfg, (list, tuple)) else \
        [metric_cfg]
    if any(m.get('format_only') for m in metrics):
        return None, 'its test_evaluator only formats results (format_only)'
    with quiet():  # a CocoMetric reads its annotation file
        evaluator = Evaluator(copy.deepcopy(metric_cfg))
    if scope == 'mmdet':
        from mmdet.evaluation import CocoMetric
        coco = [m for m in evaluator.metrics if isinstance(m, CocoMetric)]
        # CocoMetric keeps the annotation file it read as a pycocotools COCO
        apis = [getattr(m, '_coco_api', None) for m in coco]
        if not coco:
            return None, 'its test_evaluator has no CocoMetric'
        if not all(api and api.dataset.get('annotations') for api in apis):
            return None, 'its CocoMetric has no annotations (ann_file)'
        files = {m.get('ann_file') for m in metrics} - {None}
        return evaluator, ('its annotations (CocoMetric, '
                           + ', '.join(sorted(files)) + ')')
    from mmseg.evaluation import IoUMetric
    if not any(isinstance(m, IoUMetric) for m in evaluator.metrics):
        return None, 'its test_evaluator has no IoUMetric'
    if 'gt_sem_seg' not in sample['data_samples']:
        return None, 'its test pipeline loads no label maps'
    return evaluator, 'its label maps (IoUMetric)'


def reference_evaluator(scope: str):
    """The metric against the fp32 file's predictions."""
    from mmengine.evaluator import Evaluator
    if scope == 'mmdet':
        return Evaluator(dict(type='CocoMetric', metric=['bbox', 'segm']))
    return Evaluator(dict(type='IoUMetric', iou_metrics=['mIoU']))


def as_reference(fp32, samples) -> None:
    """Make ``fp32``'s predictions the ground truth of ``samples``: its
    label map, or its detections scoring >= :data:`REFERENCE_SCORE` as the
    annotations mmdet's ``CocoMetric`` reads without an annotation file."""
    if 'pred_sem_seg' in fp32:
        from mmengine.structures import PixelData
        for sample in samples:
            sample.gt_sem_seg = PixelData(data=fp32.pred_sem_seg.data.clone())
        return
    from mmdet.structures.mask import encode_mask_results
    pred = fp32.pred_instances[fp32.pred_instances.scores >= REFERENCE_SCORE]
    masks = encode_mask_results(pred.masks.numpy())
    for sample in samples:
        sample.instances = [
            dict(bbox=box.tolist(), bbox_label=int(label), ignore_flag=0,
                 mask=copy.deepcopy(mask))
            for box, label, mask in zip(pred.bboxes, pred.labels, masks)]


def measure(cfg, scope: str, dataset, indices: Sequence[int],
            fp32_path: str, int8_path: str) -> Dict:
    """The metric of the fp32 and the INT8 file (run on onnxruntime) on the
    test dataset's items ``indices``: ``figures`` (``'fp32'`` / ``'INT8'``
    -> the metric's results) and ``against`` (what they are measured
    against: the annotations, else the fp32 file's predictions, and why)."""
    from mmengine.evaluator import Evaluator

    from .exported_models import load_exported
    first = dataset[indices[0]]
    evaluator, what = annotated_evaluator(cfg, scope, first)
    if evaluator is None:
        evaluators = {name: reference_evaluator(scope)
                      for name in ('fp32', 'INT8')}
        what = f"the fp32 file's predictions ({what})"
    else:
        with quiet():
            evaluators = dict(fp32=evaluator, INT8=Evaluator(
                copy.deepcopy(cfg.test_evaluator)))
    for each in evaluators.values():
        each.dataset_meta = dataset.metainfo
    models = dict(fp32=load_exported(fp32_path),
                  INT8=load_exported(int8_path))
    image_ids = []
    for index in indices:
        data = first if index == indices[0] else dataset[index]
        samples = {name: model.infer(data['inputs'],
                                     copy.deepcopy(data['data_samples']))
                   for name, model in models.items()}
        if evaluator is None:
            as_reference(samples['fp32'], list(samples.values()))
        image_ids.append(data['data_samples'].get('img_id'))
        for name, sample in samples.items():
            evaluators[name].process([sample])
    return dict(figures={name: evaluate(each, image_ids)
                         for name, each in evaluators.items()},
                against=what)


def evaluate(evaluator, image_ids: List) -> Dict[str, float]:
    """``evaluator``'s results on the images it processed (:func:`quiet`).
    A ``CocoMetric`` evaluates every image of its annotation file unless
    told which (``img_ids``, which it otherwise fills in itself on its
    first evaluation)."""
    from mmdet.evaluation import CocoMetric
    for metric in evaluator.metrics:
        if isinstance(metric, CocoMetric) and metric._coco_api is not None:
            metric.img_ids = list(image_ids)
    with quiet():
        return evaluator.evaluate(len(image_ids))


def losses(measured: Dict, scope: str) -> Dict[str, tuple]:
    """Each figure of :data:`GATED` that the metric gives: the fp32 and the
    INT8 file's, in points, and the loss; None for the loss where there was
    nothing to measure (no object in the reference: COCO's -1). A file
    without a result where the other has one scores 0 (mmdet's
    ``CocoMetric`` gives none for a file that detects nothing)."""
    points = {name: {k.split('/')[-1]: v for k, v in results.items()}
              for name, results in measured['figures'].items()}
    rows = {}
    for key in GATED[scope]:
        if not any(key in each for each in points.values()):
            continue
        fp32, int8 = (float(points[name].get(key, 0.)) * IN_POINTS[key]
                      for name in ('fp32', 'INT8'))
        rows[key] = (fp32, int8, round(fp32 - int8, 6)
                     if fp32 >= 0 and int8 >= 0 else None)
    return rows


def log_line(name: str, results: Dict[str, float]) -> str:
    """``results`` as mmengine's log gives a test's metrics."""
    return f'  {name:<5} ' + '  '.join(
        f'{k}: {v:.4f}' if isinstance(v, numbers.Real) else f'{k}: {v}'
        for k, v in results.items())


#: modules of the whole model that --int8-keep-float may name, by toolkit
MODULE_EXAMPLES = {'mmdet': 'backbone.patch_embed roi_head.mask_head',
                   'mmseg': 'backbone.patch_embed decode_head'}


def refusal(rows: Dict[str, tuple], tolerance: float, where: str,
            scope: str) -> str:
    """The paragraph of an INT8 file that loses more than ``tolerance``."""
    lost = '; '.join(f'{name} {fp32:.2f} with the fp32 file, {int8:.2f} '
                     f'with the INT8 one ({loss:.2f} points lost)'
                     for name, (fp32, int8, loss) in rows.items()
                     if loss is not None and loss > tolerance)
    return (f'The INT8 model loses more than --int8-tolerance {tolerance:g} '
            f'point{"s" if tolerance != 1 else ""} on {where}: {lost}. '
            'No INT8 file was written (the fp32 file was). Calibrate on '
            'more images (--calib), keep the layers that lose accuracy in '
            'floating point (--int8-keep-float MODULE ..., e.g. '
            f'{MODULE_EXAMPLES[scope]}), or accept the loss with a larger '
            '--int8-tolerance.')


def check_loss(measured: Dict, scope: str, tolerance: float, where: str,
               log=print) -> Dict[str, tuple]:
    """Log both files' results and the losses; raise :class:`ExportError`
    with :func:`refusal` where one exceeds ``tolerance`` points."""
    for name, results in measured['figures'].items():
        log(log_line(name, results))
    rows = losses(measured, scope)
    if all(loss is None for _, _, loss in rows.values()):
        log('  warning: the reference has no object in these images, so '
            'the INT8 file was checked on nothing (a model that detects '
            'nothing yet: untrained, or random weights, or images without '
            'annotated objects); evaluate it with tools/test.py')
        return rows
    if any(loss is not None and loss > tolerance
           for _, _, loss in rows.values()):
        raise ExportError(refusal(rows, tolerance, where, scope))
    log('  lost: ' + ', '.join(
        f'{name} {loss:.2f} points ({fp32:.2f} -> {int8:.2f})'
        for name, (fp32, int8, loss) in rows.items() if loss is not None)
        + f', within --int8-tolerance {tolerance:g}')
    return rows
