"""A detector or segmentor ready for inference from a config and a
checkpoint, as mmdet's ``init_detector`` and mmseg's ``init_model`` build
it (what ``tools/demo.py``, ``tools/export_onnx.py`` and the benchmark
use)."""
from typing import Optional

import torch


def init_model(cfg, checkpoint: Optional[str], device: str = 'cpu'):
    """The config's detector or segmentor as mmdet's ``init_detector`` /
    mmseg's ``init_model`` build it, in eval mode on ``device``, with the
    weights of ``checkpoint`` (a local file: ours or published) loaded
    strictly, or the config's own initialisation when it is ``None``
    (SyncBN as BatchNorm on the CPU). Class
    names and palette come from the checkpoint, else from the config's test
    dataset."""
    import warnings

    from .checkpoint.published import load_model_checkpoint
    from .toolkits import check_toolkit
    # mmdet's init_detector / mmseg's init_model set up the toolkit
    if check_toolkit(cfg.get('default_scope')) == 'mmdet':
        from mmdet.apis import init_detector as init
    else:
        from mmseg.apis import init_model as init
    backbone = cfg.model.get('backbone') or {}
    if checkpoint is not None and backbone.get('init_cfg'):
        backbone.init_cfg = None  # the weights come from the checkpoint
    # init_detector warns "checkpoint is None" (the weights are loaded
    # below) after setting its own 'once' filter, which an 'ignore' filter
    # here would not outlast: its warnings are recorded and dropped
    with warnings.catch_warnings(record=True):
        model = init(cfg, None, device='cpu')
    dataset_meta = load_model_checkpoint(model, checkpoint) \
        if checkpoint is not None else {}
    if not dataset_meta.get('classes'):
        dataset = cfg.get('test_dataloader', {}).get('dataset', {})
        if dataset.get('metainfo', {}).get('classes'):
            dataset_meta = dict(dataset.metainfo)
        else:
            dataset_meta = dict(getattr(model, 'dataset_meta', None) or {})
    model.dataset_meta = dataset_meta
    if torch.device(device).type == 'cpu':  # SyncBN needs GPUs
        from mmengine.model import revert_sync_batchnorm
        model = revert_sync_batchnorm(model)
    return model.to(device).eval()
