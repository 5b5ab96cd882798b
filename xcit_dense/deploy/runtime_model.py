"""An exported file as the model of mmengine's test loop, so that
``tools/test.py CONFIG FILE.onnx`` evaluates it with the config's dataset
and metrics as it evaluates a checkpoint."""
from mmengine.model import BaseModel

from ..errors import UserError
from ..registry import MODELS
from .exported_models import load_exported


@MODELS.register_module()
class RuntimeModel(BaseModel):
    """An exported whole segmentor or detector (``file``) run on
    ``runtime`` (``'onnxruntime'`` or ``'openvino'``) for each image of a
    test batch; the batch arrives as the test pipeline packs it (pixel
    values, not preprocessed: the file holds the data preprocessor) and
    leaves as the data samples mmseg's / mmdet's metrics read. The
    config's ``data_preprocessor``, which mmengine's Runner passes to every
    model, is not used: the file holds its own."""

    def __init__(self, file: str, runtime: str = 'onnxruntime',
                 threads=None, data_preprocessor=None, scope=None):
        super().__init__()
        self.exported = load_exported(file, runtime, threads)
        if scope is not None and self.exported.scope != scope:
            raise UserError(
                f'{file} holds a {self.exported.graph} (an '
                f'{self.exported.scope} model), and the config is an '
                f'{scope} one: test it with the config it was exported '
                f'from.')

    def test_step(self, data):
        return [self.exported.infer(image, sample) for image, sample in
                zip(data['inputs'], data['data_samples'])]

    val_step = test_step

    def forward(self, *args, **kwargs):
        raise NotImplementedError(
            'RuntimeModel runs exported files in test_step only.')
