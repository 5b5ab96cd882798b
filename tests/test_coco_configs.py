"""Every COCO config loads, builds and runs on a tiny input on the CPU (the
backbone shrunk to 4 blocks): XCiT-S12's and the demos a training and an
inference step, the other sizes a forward of the backbone (and neck)."""
import functools

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.structures import InstanceData

from conftest import REPO
from shrink import (
    narrowed_detector,
    narrowed_mask2former,
    runs_forward,
    shrunk,
    trained_in_tests,
)

ALL = sorted((REPO / 'configs' / 'coco').glob('*.py'))
MASK2FORMER = [p for p in ALL if 'mask2former_' in p.name]
CONFIGS = [p for p in ALL if p not in MASK2FORMER]  # two-stage detectors


@functools.lru_cache(maxsize=None)
def _loaded(path):
    """The config at ``path``, loaded once for the tests here (a Mask R-CNN
    config serves three): they read it and change only copies."""
    return Config.fromfile(str(path))


def test_configs_found():
    names = {p.name for p in ALL}
    assert 'mask_rcnn_xcit_s12.py' in names
    for short in ('t12', 's12', 's24', 'm24'):
        for patch in (16, 8):
            for head in ('mask_rcnn', 'cascade_mask_rcnn'):
                assert f'{head}_xcit_{short}_p{patch}_3x_coco.py' in names
            assert f'mask2former_xcit_{short}_p{patch}_lsj_50e_coco.py' \
                in names


@pytest.mark.parametrize('short', ['t12', 's12', 's24', 'm24'])
def test_cascade_configs_carry_convnext_settings(short):
    """Cascade: the backbone of the same-size Mask R-CNN config, mmdet's
    ConvNeXt cascade box heads, and the ConvNeXt configs' layer decay at the
    stem (0.7 ** 7) spread over XCiT's levels."""
    coco = REPO / 'configs' / 'coco'
    cascade = _loaded(coco / f'cascade_mask_rcnn_xcit_{short}_p16_3x_coco.py')
    mask_rcnn = _loaded(coco / f'mask_rcnn_xcit_{short}_p16_3x_coco.py')
    assert cascade.model.backbone == mask_rcnn.model.backbone
    assert cascade.model.type == 'CascadeRCNN'
    heads = cascade.model.roi_head.bbox_head
    assert [h.bbox_coder.target_stds for h in heads] == [
        [0.1, 0.1, 0.2, 0.2], [0.05, 0.05, 0.1, 0.1],
        [0.033, 0.033, 0.067, 0.067]]
    assert all(h.num_shared_convs == 4 and h.num_shared_fcs == 1 and
               h.loss_bbox.type == 'GIoULoss' and h.norm_cfg.type == 'SyncBN'
               for h in heads)
    assert [r.assigner.pos_iou_thr for r in cascade.model.train_cfg.rcnn] == [
        0.5, 0.6, 0.7]
    levels = int(short[1:]) + 1  # stem, one per block; the top is at 1
    rate = cascade.optim_wrapper.paramwise_cfg.layer_decay_rate
    assert rate ** levels == pytest.approx(0.7 ** 7, rel=0.01)


def _sample(h, w, num_classes):
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    sample = DetDataSample(metainfo=dict(
        img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w),
        scale_factor=(1., 1.), batch_input_shape=(h, w)))
    masks = torch.zeros(2, h, w, dtype=torch.uint8)
    masks[0, 8:40, 10:50] = 1
    masks[1, 30:60, 40:90] = 1
    sample.gt_instances = InstanceData(
        bboxes=torch.tensor([[10., 8., 50., 40.], [40., 30., 90., 60.]]),
        labels=torch.tensor([0, num_classes - 1]),
        masks=BitmapMasks(masks.numpy(), h, w))
    return sample


#: the detectors built and run here, by config: a recipe and its short
#: name share one, run once
_RUN = set()


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: p.name)
def test_config_builds_and_runs(path):
    from mmdet.registry import MODELS
    cfg = _loaded(path)
    assert cfg.default_scope == 'mmdet'
    backbone = cfg.model.backbone
    assert backbone.type == 'xcit_dense.XCiT'
    from xcit_dense import ARCH_SETTINGS
    dim = ARCH_SETTINGS[backbone.arch]['embed_dim']
    assert cfg.model.neck.in_channels == [dim] * 4
    run = (trained_in_tests(path.name), repr(cfg.model))
    if run in _RUN:
        return
    _RUN.add(run)
    model_cfg = narrowed_detector(shrunk(cfg.model))
    from xcit_dense.runner import replace_syncbn
    replace_syncbn(model_cfg)  # as tools/*.py do on the CPU
    init_default_scope('mmdet')
    model = MODELS.build(model_cfg)
    model.init_weights()
    mask_head = model.roi_head.mask_head  # a ModuleList in a cascade
    num_classes = (mask_head[-1] if isinstance(mask_head, torch.nn.ModuleList)
                   else mask_head).num_classes
    _trains_and_predicts_or_runs(model, num_classes, path)


def _trains_and_predicts_or_runs(model, num_classes, path):
    if trained_in_tests(path.name):
        _trains_and_predicts(model, num_classes)
        return
    assert len(runs_forward(model)) >= 4


def _trains_and_predicts(model, num_classes, h=64, w=96):
    """A training step on two images (finite loss, gradients reach the
    backbone), then a prediction with masks at the image's size."""
    data = dict(inputs=[torch.randint(0, 255, (3, h, w), dtype=torch.uint8)
                        for _ in range(2)],
                data_samples=[_sample(h, w, num_classes) for _ in range(2)])
    model.train()
    batch = model.data_preprocessor(data, training=True)
    losses = model(**batch, mode='loss')
    loss, _ = model.parse_losses(losses)
    assert torch.isfinite(loss)
    loss.backward()
    assert model.backbone.blocks[0].attn.qkv.weight.grad is not None
    model.eval()
    with torch.no_grad():
        results = model.test_step(data)
    assert len(results) == 2
    assert results[0].pred_instances.masks.shape[-2:] == (h, w)


@pytest.mark.parametrize('path', MASK2FORMER, ids=lambda p: p.name)
def test_mask2former_config_builds_and_runs(path):
    """Mask2Former (instance): the backbone of the same-size Mask R-CNN
    config; XCiT-S12's a training step and a prediction with the head
    shrunk (fewer queries, layers and loss points), without the 1024x1024
    batch padding of LSJ; the other sizes a forward of the backbone."""
    from mmdet.registry import MODELS
    cfg = _loaded(path)
    mask_rcnn = _loaded(path.parent / path.name.replace(
        'mask2former_', 'mask_rcnn_').replace('_lsj_50e_', '_3x_'))
    assert cfg.model.backbone == mask_rcnn.model.backbone
    dim = mask_rcnn.model.neck.in_channels
    assert cfg.model.panoptic_head.in_channels == dim
    init_default_scope('mmdet')
    model_cfg = shrunk(cfg.model)
    narrowed_mask2former(model_cfg.panoptic_head)
    model = MODELS.build(model_cfg)
    model.init_weights()
    _trains_and_predicts_or_runs(
        model, model.panoptic_head.num_things_classes, path)

