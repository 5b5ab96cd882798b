"""What is exported: modules whose ``forward`` calls the model's own methods
(no copy of the model), so the graph computes what mmdet / mmseg compute.

* :class:`FeatureGraph`: the backbone's pyramid, or the backbone and neck
  (``model.extract_feat``), on the model's input (the data preprocessor's
  output: normalised, channel order converted).
* :class:`SegmentorGraph`: a whole semantic segmentor, image in (the pixel
  values ``LoadImageFromFile`` gives, channels first), per-pixel class
  logits and labels out at the image's size, as mmseg's
  ``EncoderDecoder.predict`` computes them for an unpadded image.
* :class:`~.detector_graph.DetectorGraph` (built on this module's helpers):
  a whole Mask R-CNN, image in, boxes, scores, labels and mask probabilities
  out.

Which of them a model exports is :func:`.onnx_export.graph_for`'s choice.
"""
import json
from typing import Dict, Iterator, List, Tuple

import torch
import torch.nn as nn

from ..errors import UserError


class FeatureGraph(nn.Module):
    """``model.backbone(inputs)`` or, ``with_neck``,
    ``model.extract_feat(inputs)``: a tuple of NCHW maps."""

    def __init__(self, model: nn.Module, with_neck: bool):
        super().__init__()
        self.model = model
        self.with_neck = with_neck
        self.in_channels = input_channels(model)

    @property
    def output_names(self) -> List[str]:
        n = len(self.model.backbone.out_strides) if not self.with_neck else \
            self._num_neck_outputs()
        return [f'feat{i}' for i in range(n)]

    def _num_neck_outputs(self) -> int:
        neck = self.model.neck
        return getattr(neck, 'num_outs', len(getattr(neck, 'in_channels',
                                                     [])))

    def metadata(self) -> Dict[str, str]:
        """What the exported file records of its graph (ONNX
        ``metadata_props``)."""
        return {'xcit_dense.graph': type(self).__name__}

    def exported_parts(self) -> Dict[str, nn.Module]:
        """The modules the graph runs, by name: the backbone (and neck);
        not the heads the model also holds."""
        parts = {'model.backbone': self.model.backbone}
        if self.with_neck:
            parts['model.neck'] = self.model.neck
        return parts

    def forward(self, inputs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        feats = self.model.extract_feat(inputs) if self.with_neck else \
            self.model.backbone(inputs)
        return tuple(feats)


class SegmentorGraph(nn.Module):
    """A semantic segmentor from image to labels: the data preprocessor's
    channel conversion and normalisation, ``segmentor.inference`` (backbone,
    neck, decode head, logits resized to the image bilinearly with the
    head's ``align_corners``), then the label of each pixel (arg-max, or the
    head's threshold on the sigmoid for a single output channel). The
    auxiliary head is not part of inference, as in mmseg."""
    output_names = ['seg_logits', 'seg_labels']
    takes_images = True

    def __init__(self, segmentor: nn.Module):
        super().__init__()
        pre = segmentor.data_preprocessor
        if getattr(pre, 'test_cfg', None):
            raise UserError(
                'The segmentor pads test images (data_preprocessor.test_cfg '
                f'= {dict(pre.test_cfg)}); the exported graph takes images '
                'as they are. Remove test_cfg from the data preprocessor '
                '(--cfg-options model.data_preprocessor.test_cfg=None) or '
                'pad the images before the exported model.')
        self.model = segmentor
        self.in_channels = input_channels(segmentor)

    def metadata(self) -> Dict[str, str]:
        """What the exported file records for running it without the mm
        model (:class:`~xcit_dense.deploy.ExportedSegmentor`): the class
        names and palette, the config's test pipeline and visualizer, and
        how the logits become labels at the image's size (the decode head's
        ``align_corners`` and, for one output channel, ``threshold``)."""
        head = self.model.decode_head
        return dict(
            model_metadata(self),
            **{'xcit_dense.align_corners': json_text(bool(head.align_corners)),
               'xcit_dense.threshold': json_text(getattr(head, 'threshold',
                                                         None))})

    def exported_parts(self) -> Dict[str, nn.Module]:
        """The modules the graph runs: the whole segmentor."""
        return {'model': self.model}

    def forward(self, image: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        x = normalised(self.model.data_preprocessor, image)
        H, W = x.shape[-2:]
        metas = [dict(img_shape=(H, W), ori_shape=(H, W), pad_shape=(H, W))
                 for _ in range(x.shape[0])]
        logits = self.model.inference(x, metas)
        if logits.shape[1] > 1:
            labels = logits.argmax(dim=1)
        else:
            threshold = self.model.decode_head.threshold
            labels = (logits.sigmoid() > threshold).squeeze(1).long()
        return logits, labels


def normalised(preprocessor: nn.Module, image: torch.Tensor
               ) -> torch.Tensor:
    """Pixel values as the data preprocessor passes them on: channel order
    converted and normalised (mmseg's ``SegDataPreprocessor`` names its
    switch ``channel_conversion``, mmengine's ``ImgDataPreprocessor``, which
    mmdet's extends, ``_channel_conversion``)."""
    x = image.float()
    convert = getattr(preprocessor, 'channel_conversion', None)
    if convert is None:
        convert = preprocessor._channel_conversion
    if convert and x.shape[1] == 3:
        x = x[:, [2, 1, 0]]
    if preprocessor._enable_normalize:
        x = (x - preprocessor.mean) / preprocessor.std
    return x


def model_metadata(graph: nn.Module) -> Dict[str, str]:
    """What a whole model's exported file records to run without the mm
    model: the graph's class, the model's class names and palette, the
    config's test pipeline and visualizer."""
    cfg = getattr(graph.model, 'cfg', None) or {}
    return {
        'xcit_dense.graph': type(graph).__name__,
        'xcit_dense.dataset_meta': json_text(
            getattr(graph.model, 'dataset_meta', None) or {}),
        'xcit_dense.test_pipeline': json_text(cfg.get('test_pipeline', [])),
        'xcit_dense.visualizer': json_text(cfg.get('visualizer', {})),
    }


def json_text(value) -> str:
    """``value`` (config dicts and lists, arrays of a palette) as JSON."""
    from mmengine.config import ConfigDict

    def plain(v):
        if isinstance(v, (ConfigDict, dict)):
            return {str(k): plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v.tolist() if hasattr(v, 'tolist') else v
    return json.dumps(plain(value))


def modules_run(graph: nn.Module) -> Iterator[Tuple[str, nn.Module]]:
    """The modules the graph runs (its ``exported_parts()``), by name."""
    for prefix, part in graph.exported_parts().items():
        yield from part.named_modules(prefix=prefix)


def pools_to_cells(graph: nn.Module) -> bool:
    """The graph runs adaptive average pooling to more than one cell
    (UperNet's pyramid pooling), which an export with free height and width
    computes with :mod:`.adaptive_pooling`."""
    return any(isinstance(m, nn.AdaptiveAvgPool2d) and
               m.output_size not in (1, (1, 1))
               for _, m in modules_run(graph))


def sizes_from_python(graph: nn.Module) -> bool:
    """The graph runs modules that compute a size as a Python number from
    the input's shape: mmseg's ``Upsample`` by a scale factor (the Semantic
    FPN head: ``int(h * scale_factor)``). Traced with Python running, the
    number becomes a constant of the export size; traced by dynamo
    (``torch.export(strict=True)``) it stays symbolic."""
    return any(type(m).__name__ == 'Upsample' and
               type(m).__module__.startswith('mmseg.') and not m.size
               for _, m in modules_run(graph))


def input_channels(model: nn.Module) -> int:
    """Channels of the images the model takes: those of the backbone's
    first convolution."""
    for module in model.backbone.modules():
        if isinstance(module, nn.Conv2d):
            return module.in_channels
    return 3
