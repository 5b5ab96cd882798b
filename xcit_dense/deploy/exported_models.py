"""An exported whole model run on an image without the mm model: the
config's test pipeline (recorded in the file), the ONNX graph on a runtime,
then what mmseg / mmdet do after the network (logits resized to the image
and turned into labels; boxes scaled back to the image and masks pasted),
giving the data sample their visualizers draw (``tools/demo.py`` with an
``.onnx`` file)."""
import json
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from ..errors import UserError, first_line
from .masks import paste_masks
from .runtimes import read_metadata, runtime_session


class ExportedModel:
    """A whole model exported by ``tools/export_onnx.py`` (graph
    ``graph``), run on ``runtime`` (``'onnxruntime'`` or ``'openvino'``).

    Attributes:
        dataset_meta (dict): class names and palette of the model.
        visualizer_cfg (dict): the config's visualizer.
    """
    graph = ''
    scope = ''

    def __init__(self, path: str, runtime: str = 'onnxruntime',
                 threads: Optional[int] = None,
                 meta: Optional[Dict[str, str]] = None):
        # ``meta``: the file's metadata when the caller has read it already
        # (reading it parses the whole file)
        self.path, self.runtime = path, runtime
        self.meta = _metadata(path) if meta is None else meta
        _check_graph(path, self.meta, (self.graph, ))
        self.dataset_meta = self._json('dataset_meta')
        if 'palette' in self.dataset_meta:  # colours are tuples, not lists
            self.dataset_meta['palette'] = [
                tuple(c) for c in self.dataset_meta['palette']]
        self.visualizer_cfg = self._json('visualizer')
        self.pipeline = self._pipeline(self._json('test_pipeline'))
        try:
            self.run = runtime_session(runtime, path, threads)
        except Exception as error:  # the runtimes' errors have many types
            raise UserError(f'{runtime} cannot load {path}: '
                            f'{first_line(error)}') from error

    def _json(self, key: str):
        return json.loads(self.meta[f'xcit_dense.{key}'])

    def _pipeline(self, transforms):
        """The test pipeline without its label loading, as mmdet's
        ``inference_detector`` and mmseg's ``inference_model`` use it."""
        from mmcv.transforms import Compose

        from ..toolkits import type_name, use_toolkit
        use_toolkit(self.scope)
        return Compose([_tuples(t) for t in transforms
                        if type_name(t) != 'LoadAnnotations'])

    def predict(self, image_path: str):
        """The image's data sample, predictions at its original size."""
        data = self.pipeline(dict(img_path=image_path))
        return self.infer(data['inputs'], data['data_samples'])

    def infer(self, image: torch.Tensor, sample):
        """Predictions for one image as the test pipeline gives it
        (``(3, H, W)`` pixel values) added to its data sample."""
        fixed = self.run.input_shape[2:]
        if None not in fixed and list(image.shape[-2:]) != fixed:
            raise UserError(
                f'{self.path} was exported for {fixed[0]}x{fixed[1]} '
                f'images, and the test pipeline gives this one '
                f'({getattr(sample, "img_path", None) or "an image"}) at '
                f'{image.shape[-2]}x{image.shape[-1]}: export it with '
                f'--dynamic (any size), or with --shape H W of the size '
                f"the config's test pipeline gives every image.")
        outputs = self.run(image[None].float().numpy())
        return self.postprocess([torch.from_numpy(o) for o in outputs],
                                sample)


class ExportedSegmentor(ExportedModel):
    """An exported :class:`~xcit_dense.deploy.SegmentorGraph`: predictions
    as mmseg's ``postprocess_result`` makes them (``seg_logits`` and
    ``pred_sem_seg`` at the original size)."""
    graph = 'SegmentorGraph'
    scope = 'mmseg'

    def postprocess(self, outputs, sample):
        from mmengine.structures import PixelData
        align_corners = self._json('align_corners')
        logits = F.interpolate(outputs[0], size=tuple(sample.ori_shape),
                               mode='bilinear',
                               align_corners=align_corners)[0]
        if logits.shape[0] > 1:
            labels = logits.argmax(dim=0, keepdim=True)
        else:  # one channel: mmseg thresholds the sigmoid
            logits = logits.sigmoid()
            labels = (logits > self._json('threshold')).to(logits)
        sample.set_data(dict(seg_logits=PixelData(data=logits),
                             pred_sem_seg=PixelData(data=labels)))
        return sample


class ExportedDetector(ExportedModel):
    """An exported :class:`~xcit_dense.deploy.DetectorGraph`: predictions
    as mmdet's ``predict(rescale=True)`` makes them (boxes in the original
    image, masks pasted there with the config's ``mask_thr_binary``)."""
    graph = 'DetectorGraph'
    scope = 'mmdet'

    def postprocess(self, outputs, sample):
        from mmdet.models.utils import samplelist_boxtype2tensor
        from mmengine.structures import InstanceData
        # as mmdet's data preprocessor leaves them: the ground truth's boxes
        # as tensors (what its visualizer draws)
        samplelist_boxtype2tensor([sample])
        boxes, scores, labels, probs = outputs
        scale = boxes.new_tensor(sample.scale_factor).repeat(2)
        boxes = boxes / scale
        height, width = sample.ori_shape[:2]
        sample.pred_instances = InstanceData(
            bboxes=boxes, scores=scores, labels=labels,
            masks=paste_masks(probs, boxes, height, width,
                              self._json('mask_thr_binary')))
        return sample


def _tuples(value):
    """A transform's settings read back from JSON, which has no tuples:
    lists of plain values become the tuples configs write (mmdet's
    ``Resize`` takes ``scale`` only as a tuple); lists of transforms stay
    lists."""
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [_tuples(v) for v in value]
        return items if any(isinstance(v, dict) for v in items) else \
            tuple(items)
    return value


def load_exported(path: str, runtime: str = 'onnxruntime',
                  threads: Optional[int] = None) -> ExportedModel:
    """The exported segmentor or detector in ``path``, by the graph its
    metadata names."""
    kinds = {k.graph: k for k in (ExportedSegmentor, ExportedDetector)}
    meta = _metadata(path)
    graph = _check_graph(path, meta, tuple(kinds))
    return kinds[graph](path, runtime, threads, meta)


def _metadata(path: str) -> Dict[str, str]:
    """:func:`read_metadata`, or one paragraph where ``path`` is no ONNX
    file."""
    try:
        return read_metadata(path)
    except Exception as error:  # protobuf's DecodeError, onnx's, OSError
        raise UserError(f'{path} cannot be read as an ONNX file: '
                        f'{first_line(error)}') from error


def _check_graph(path: str, meta: Dict[str, str],
                 allowed: Tuple[str, ...]) -> str:
    graph = meta.get('xcit_dense.graph')
    if graph not in allowed:
        what = f'a {graph}' if graph else 'no graph of this project'
        raise UserError(
            f'{path} holds {what}: only a whole segmentor or detector '
            'exported by tools/export_onnx.py (without --backbone-only or '
            '--backbone-and-neck) gives predictions to draw.')
    return graph
