"""Each stronger head family trains with the XCiT backbone and the config's
own optimizer (our constructor with the recipe's rules): a few steps on one
small batch of shapes bring its loss well down and its predictions of that
batch to a metric the untrained model does not reach. Cascade Mask R-CNN and
Mask2Former (COCO instances, ADE20K); the backbone shrunk to 4 blocks and
the heads to fewer RoIs / queries and narrower features, as in the config
tests. The Mask2Former demo configs train and test through tools/ on the
tiny synthetic data."""
import copy
import re

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper

from conftest import REPO
from shrink import (
    NARROW_HEAD,
    narrowed_detector,
    narrowed_mask2former,
    shrunk,
)
from test_ade20k import _sample as seg_sample
from test_coco_configs import _sample as det_sample
from tool_runs import run_tool_here

#: config, optimizer steps, the least metric of the predictions afterwards
#: (:func:`metric`; measured 0.13, 1.0 and 0.89; untrained, all 0), the
#: width of the heads' features (256 in the configs: half a step's time;
#: the cascade finds no box in its few steps at 32, the ADE20K Mask2Former
#: labels 0.33 of the pixels at 64)
CASES = {
    'cascade_coco': ('coco/cascade_mask_rcnn_xcit_t12_p16_3x_coco.py', 12,
                     0.05, 64),
    'mask2former_coco': ('coco/mask2former_xcit_t12_p16_lsj_50e_coco.py', 18,
                         0.5, 64),
    'mask2former_ade20k': ('ade20k/mask2former_xcit_t12_p16_160k_ade20k.py',
                           16, 0.15, 128),
}


def shrunk_model(cfg, width):
    """The config's model shrunk as in the config tests, without drop path,
    SyncBN as BatchNorm (as tools/*.py on the CPU), its heads' features
    ``width`` wide (a two-stage detector's FPN, RPN and RoI features, or
    Mask2Former's)."""
    from xcit_dense.runner import replace_syncbn
    from xcit_dense.toolkits import use_toolkit
    model_cfg = shrunk(cfg.model, drop_path_rate=0.)
    if model_cfg.get('roi_head'):
        narrowed_detector(model_cfg, width)
    else:
        narrowed_mask2former(model_cfg.get('panoptic_head') or
                             model_cfg.decode_head, width)
    replace_syncbn(model_cfg)
    return use_toolkit(cfg.default_scope).MODELS.build(model_cfg)


def metric(model, data):
    """The task's metric of ``model``'s predictions of the batch ``data``:
    box AP at IoU 0.5 (mmdet's ``eval_map``) of a detector, the fraction of
    pixels labelled right (of 150 classes) of a segmentor. After a few
    steps on one batch a detector finds its two boxes with low scores
    (Cascade: 0.08 of 81 classes) and a segmentor paints every pixel one
    of the batch's classes."""
    from mmdet.evaluation.functional import eval_map
    model.eval()
    with torch.no_grad():
        preds = model.test_step(copy.deepcopy(data))
    model.train()
    if 'pred_sem_seg' in preds[0]:
        right = [(p.pred_sem_seg.data == s.gt_sem_seg.data).float().mean()
                 for p, s in zip(preds, data['data_samples'])]
        return (sum(right) / len(right)).item()
    detections, truth = [], []
    for pred, sample in zip(preds, data['data_samples']):
        found = pred.pred_instances
        boxes = torch.cat([found.bboxes, found.scores[:, None]], 1).numpy()
        detections.append([boxes[(found.labels == c).numpy()]
                           for c in range(80)])
        truth.append(dict(bboxes=sample.gt_instances.bboxes.numpy(),
                          labels=sample.gt_instances.labels.numpy()))
    return eval_map(detections, truth, iou_thr=0.5, logger='silent')[0]


@pytest.mark.parametrize('case', CASES)
def test_head_family_learns(case):
    path, steps, least, width = CASES[case]
    cfg = Config.fromfile(str(REPO / 'configs' / path))
    torch.manual_seed(0)
    model = shrunk_model(cfg, width)
    model.init_weights()
    model.train()
    h, w = 64, 96
    if cfg.default_scope == 'mmdet':
        samples = [det_sample(h, w, 80) for _ in range(2)]
    else:  # shapes to learn, not noise: two rectangles on background
        samples = [seg_sample(h, w, 150) for _ in range(2)]
        for sample in samples:
            label = torch.zeros(1, h, w, dtype=torch.long)
            label[:, 8:40, 10:50] = 1
            label[:, 30:60, 40:90] = 2
            sample.gt_sem_seg.data = label
    data = dict(inputs=[torch.randint(0, 255, (3, h, w), dtype=torch.uint8,
                                      generator=torch.Generator().manual_seed(i))
                        for i in range(2)], data_samples=samples)
    optim_cfg = copy.deepcopy(cfg.optim_wrapper)
    optim_cfg.type = 'OptimWrapper'  # no AMP on the CPU
    optim_cfg.pop('loss_scale', None)
    optim_cfg.optimizer.lr *= 10  # a few steps instead of thousands
    wrapper = build_optim_wrapper(model, optim_cfg)
    losses = []
    for _ in range(steps):
        batch = model.data_preprocessor(copy.deepcopy(data), training=True)
        loss, _ = model.parse_losses(model(**batch, mode='loss'))
        wrapper.update_params(loss)
        losses.append(loss.item())
    # the mean of the last three steps well below the first step's loss
    assert sum(losses[-3:]) / 3 < 0.7 * losses[0], (case, losses)
    assert metric(model, data) >= least, case


#: demo config, the data fixture, the metric tools/test.py prints
DEMOS = {
    'coco': ('coco/demo_mask2former_xcit_nano_synthetic.py', 'tiny_coco',
             'coco/segm_mAP'),
    'ade20k': ('ade20k/demo_mask2former_xcit_nano_synthetic.py',
               'tiny_ade20k', 'mIoU'),
}


def tiny_demo_config(demo, root, tmp_path, max_iters=2, narrow=True):
    """The Mask2Former demo ``demo`` on the tiny data at ``root``: 4
    backbone blocks, 10 queries, 3 decoder and 1 encoder layers; the head
    64 wide where ``narrow``."""
    path = DEMOS[demo][0]
    head = 'panoptic_head' if demo == 'coco' else 'decode_head'
    layers = NARROW_HEAD if narrow else """transformer_decoder=dict(
                    num_layers=3),
                pixel_decoder=dict(encoder=dict(num_layers=1)))"""
    config = tmp_path / 'demo.py'
    config.write_text(f"""
_base_ = r'{REPO / 'configs' / path}'
model = dict(
    backbone=dict(depth=4, out_indices=(0, 1, 2, 3)),
    {head}=dict(num_queries=10,
                {layers})
train_dataloader = dict(batch_size=2, num_workers=0,
                        persistent_workers=False,
                        dataset=dict(data_root=r'{root}'))
val_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=r'{root}'))
test_dataloader = val_dataloader
max_iters = {max_iters}
train_cfg = dict(max_iters=max_iters, val_interval=max_iters)
default_hooks = dict(checkpoint=dict(interval=max_iters),
                     logger=dict(interval=1))
""" + (f"val_evaluator = dict(ann_file=r'{root}/annotations/val.json')\n"
       "test_evaluator = val_evaluator\n" if demo == 'coco' else ''))
    return config


@pytest.mark.parametrize('demo', DEMOS)
def test_mask2former_demo_trains_and_tests_through_the_tools(
        demo, request, tmp_path):
    """The Mask2Former demos on the tiny data: tools/train.py for two
    iterations (the recipe's data check, loop, hooks and checkpoint), then
    tools/test.py on its checkpoint, with the demo's evaluator."""
    _, fixture, metric = DEMOS[demo]
    config = tiny_demo_config(demo, request.getfixturevalue(fixture),
                              tmp_path)
    work = tmp_path / 'work'
    proc = run_tool_here('tools/train.py', config, '--work-dir', work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert metric in proc.stdout + proc.stderr
    proc = run_tool_here('tools/test.py', config, work / 'iter_2.pth',
                         '--work-dir', tmp_path / 'test')
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert metric in proc.stdout + proc.stderr


def test_mask2former_demo_trains_in_fp16_on_the_cpu(tiny_coco, tmp_path):
    """``benchmarks/probes/fp16_training_on_cpu.py``: tools/train.py with fp16
    autocast and a dynamic loss scaler on the CPU, the convolutions in
    fp32. Its first steps overflow in fp16 and are skipped, each halving
    the scale from 2**16 (the log shows its mean over the logging window);
    training goes on to its checkpoint, with the command line's other
    options and the config's Float32PartsHook."""
    config = tiny_demo_config('coco', tiny_coco, tmp_path, max_iters=3)
    # (its pixel decoder is in fp32 by its type) a part named in fp32
    config.write_text(config.read_text() + (
        "custom_hooks = [dict(type='xcit_dense.Float32PartsHook', "
        "parts=['panoptic_head.transformer_decoder'])]\n"))
    work = tmp_path / 'work'
    proc = run_tool_here('benchmarks/probes/fp16_training_on_cpu.py', config,
                         '--work-dir', work, '--cfg-options',
                         'randomness.seed=1', 'val_cfg=None',
                         'val_dataloader=None', 'val_evaluator=None')
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    scales = [float(s) for s in re.findall(r'loss_scale: ([0-9.]+)', log)]
    assert len(scales) == 3 and scales[-1] < 2.0 ** 16, scales
    assert (work / 'iter_3.pth').is_file()
    assert 'panoptic_head.transformer_decoder run in float32' in log
    assert re.search(r'"?seed"?\s*[:=]\s*1\b', log), 'seed option lost'
