"""An exported segmentor run on an image without the mm model: the
config's test pipeline (recorded in the file), the ONNX graph on a runtime,
the logits resized to the image and turned into labels as mmseg's
``postprocess_result`` does; a :class:`SegDataSample` that mmseg's
visualizer draws (``tools/demo.py`` with an ``.onnx`` file)."""
import json
from typing import Optional

import torch
import torch.nn.functional as F

from ..errors import UserError
from .runtimes import read_metadata, runtime_session


class ExportedSegmentor:
    """A :class:`~xcit_dense.deploy.SegmentorGraph` exported by
    ``tools/export_onnx.py``, run on ``runtime`` (``'onnxruntime'`` or
    ``'openvino'``).

    Attributes:
        dataset_meta (dict): class names and palette of the model.
        visualizer_cfg (dict): the config's visualizer.
    """

    def __init__(self, path: str, runtime: str = 'onnxruntime',
                 threads: Optional[int] = None):
        meta = read_metadata(path)
        graph = meta.get('xcit_dense.graph')
        if graph != 'SegmentorGraph':
            what = f'a {graph}' if graph else 'no graph of this project'
            raise UserError(
                f'{path} holds {what}: only a whole segmentor exported by '
                'tools/export_onnx.py from an mmseg config (without '
                '--backbone-only) gives labels to draw.')
        self.dataset_meta = json.loads(meta['xcit_dense.dataset_meta'])
        self.visualizer_cfg = json.loads(meta['xcit_dense.visualizer'])
        self.align_corners = json.loads(meta['xcit_dense.align_corners'])
        self.threshold = json.loads(meta['xcit_dense.threshold'])
        self.pipeline = self._pipeline(
            json.loads(meta['xcit_dense.test_pipeline']))
        self.run = runtime_session(runtime, path, threads)

    @staticmethod
    def _pipeline(transforms):
        """The test pipeline without its label loading, as mmseg's
        ``inference_model`` runs it."""
        from mmcv.transforms import Compose
        from mmseg.utils import register_all_modules
        register_all_modules()
        return Compose([t for t in transforms
                        if t.get('type') != 'LoadAnnotations'])

    def predict(self, image_path: str):
        """The image's ``SegDataSample``: ``seg_logits`` and
        ``pred_sem_seg`` at the image's original size."""
        from mmengine.structures import PixelData
        data = self.pipeline(dict(img_path=image_path))
        sample = data['data_samples']
        logits, _ = self.run(data['inputs'][None].float().numpy())
        logits = F.interpolate(torch.from_numpy(logits),
                               size=tuple(sample.ori_shape), mode='bilinear',
                               align_corners=self.align_corners)[0]
        if logits.shape[0] > 1:
            labels = logits.argmax(dim=0, keepdim=True)
        else:  # one channel: mmseg thresholds the sigmoid
            logits = logits.sigmoid()
            labels = (logits > self.threshold).to(logits)
        sample.set_data(dict(seg_logits=PixelData(data=logits),
                             pred_sem_seg=PixelData(data=labels)))
        return sample
