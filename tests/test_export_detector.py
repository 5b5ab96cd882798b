"""The whole Mask R-CNN exported to ONNX (xcit_dense/deploy/detector_graph.py):
a tiny detector through tools/export_onnx.py --dynamic, verified against
mmdet's predict at three sizes, standard operators only, drawn by
tools/demo.py on both runtimes as the PyTorch model draws it; its INT8 file
measured with COCO mAP against the fp32 file; the mask pasting and the
detection matching on their own; what is refused."""
import re

import numpy as np
import onnx
import pytest
import torch

from benchmarks.harness.builders import sharpen_classifiers
from xcit_dense.deploy import (
    DetectorGraph,
    ExportError,
    paste_masks,
    verify_onnx,
)
from xcit_dense.deploy.detection_check import compare_detections
from xcit_dense.errors import UserError

from conftest import REPO
from test_export_onnx import TINY, build
from tool_runs import run_tool_here

MASK_RCNN = f"""
_base_ = r'{REPO}/configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py'
model = dict(
    backbone=dict({', '.join(f'{k}={v!r}' for k, v in TINY.items())}),
    neck=dict(in_channels=[32] * 4, out_channels=16),
    rpn_head=dict(in_channels=16, feat_channels=16),
    roi_head=dict(bbox_roi_extractor=dict(out_channels=16),
                  bbox_head=dict(in_channels=16, fc_out_channels=32),
                  mask_roi_extractor=dict(out_channels=16),
                  mask_head=dict(in_channels=16, conv_out_channels=16)))
"""


def detector_checkpoint(tmp_path, data_root):
    """A tiny Mask R-CNN on the tiny COCO data whose classifiers are
    sharpened (an initialised one scores every class about 1/4 and ties
    everywhere): a few confident, distinct detections. Its RPN scores most
    anchors below 1e-8, as a trained one does: onnxruntime's Sigmoid
    rounds those to 0, which the exported RPN, ranking by logits, must not
    care about (tests/test_export_rpn_ranking.py)."""
    config, model = build(MASK_RCNN + f"""
data_root = '{data_root}/'
test_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                       dataset=dict(data_root=data_root))
test_evaluator = dict(ann_file=data_root + 'annotations/val.json')
""", tmp_path, 'mask_rcnn')
    sharpen_classifiers(model)
    with torch.no_grad():
        model.rpn_head.rpn_cls.bias.sub_(20)
    checkpoint = tmp_path / 'mask_rcnn.pth'
    torch.save(dict(state_dict=model.state_dict(), meta={}), checkpoint)
    return config, checkpoint, model


@pytest.fixture(scope='module')
def exported_detector(tmp_path_factory, tiny_coco):
    """That detector exported by ``tools/export_onnx.py --dynamic``: its
    config, checkpoint, model, file and the tool's output."""
    tmp = tmp_path_factory.mktemp('mask_rcnn')
    config, checkpoint, model = detector_checkpoint(tmp, tiny_coco)
    out = tmp / 'mask_rcnn.onnx'
    proc = run_tool_here('tools/export_onnx.py', config, checkpoint, '--out',
                         out, '--shape', 96, 128, '--dynamic')
    assert proc.returncode == 0, proc.stderr[-3000:]
    return config, checkpoint, model, out, proc.stdout


def test_mask_rcnn_export_predicts_what_mmdet_predicts(exported_detector):
    """Verified against mmdet's predict at the export size, two others
    (--dynamic) and on the test dataset's images; standard operators
    only."""
    config, checkpoint, model, out, stdout = exported_detector
    verified = next(line for line in stdout.splitlines()
                    if line.startswith('verified with onnxruntime'))
    assert verified.startswith(
        'verified with onnxruntime against mmdet predict on 7 images (4 of '
        'them from the test dataset) at 96x128, 73x97, 32x64, 128x128: 140 '
        'of 140 detections matched'), verified
    file = onnx.load(str(out))
    assert [o.name for o in file.graph.output] == [
        'boxes', 'scores', 'labels', 'mask_probs']
    ops = {(n.domain, n.op_type) for n in file.graph.node}
    assert {d for d, _ in ops} == {''}  # the standard operator set only
    assert {('', 'NonMaxSuppression'), ('', 'RoiAlign'),
            ('', 'TopK')} <= ops


def test_mask_rcnn_file_drawn_as_the_pytorch_model_draws(exported_detector,
                                                         tmp_path):
    """Both runtimes predict mmdet's detections from the file, and
    tools/demo.py draws them as it draws the PyTorch model's."""
    config, checkpoint, model, out, _ = exported_detector
    import cv2
    from mmdet.apis import inference_detector

    from xcit_dense.deploy import load_exported
    image = tmp_path / 'image.png'
    cv2.imwrite(str(image), np.random.default_rng(2).integers(
        0, 256, (100, 141, 3), dtype=np.uint8))  # resized to 91x128
    with torch.no_grad():
        ref = inference_detector(model, str(image)).pred_instances
    drawn = {}
    for name, args in [('torch', (config, checkpoint)),
                       ('onnxruntime', (out, )),
                       ('openvino', (out, '--runtime', 'openvino'))]:
        if name != 'torch':
            runtime = load_exported(str(out), name)
            got = runtime.predict(str(image)).pred_instances
            assert torch.equal(got.labels, ref.labels)
            torch.testing.assert_close(got.scores, ref.scores, rtol=1e-4,
                                       atol=1e-6)
            torch.testing.assert_close(got.bboxes, ref.bboxes, rtol=0,
                                       atol=1e-3)
            assert torch.equal(got.masks, ref.masks)
        proc = run_tool_here('tools/demo.py', image, *args, '--out',
                             tmp_path / f'{name}.png', '--score-thr', 0.2)
        assert proc.returncode == 0, proc.stderr[-2000:]
        drawn[name] = cv2.imread(str(tmp_path / f'{name}.png')).astype(int)
    assert f'{len(ref.scores)} objects with score >= 0.2 (openvino)' \
        in proc.stdout
    for name in ('onnxruntime', 'openvino'):
        # the same boxes, masks and labels; box edges drawn from coordinates
        # 1e-4 px apart antialias a few pixels differently
        assert (drawn[name] != drawn['torch']).mean() < 0.01


def test_mask_rcnn_file_evaluated_by_the_test_tool(exported_detector,
                                                   tmp_path):
    """tools/test.py evaluates the file on the config's dataset as it
    evaluates the checkpoint: the same predictions for every image."""
    config, checkpoint, _, out, _ = exported_detector
    import pickle
    predictions = {}
    for name, model_file in [('torch', checkpoint), ('onnx', out)]:
        # (--show-dir: mmdet's visualizer draws the ground truth's boxes,
        # which the exported file's path leaves as tensors too)
        proc = run_tool_here('tools/test.py', config, model_file,
                             '--work-dir', tmp_path / name, '--out',
                             tmp_path / f'{name}.pkl', '--show-dir', 'shown')
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert 'coco/segm_mAP' in proc.stdout + proc.stderr
        assert len(list((tmp_path / name).rglob('shown/*.png'))) == 4
        with open(tmp_path / f'{name}.pkl', 'rb') as f:
            predictions[name] = pickle.load(f)
    assert len(predictions['onnx']) == len(predictions['torch']) == 4
    for got, ref in zip(predictions['onnx'], predictions['torch']):
        got, ref = got['pred_instances'], ref['pred_instances']
        assert len(ref['labels']) > 0
        assert torch.equal(got['labels'], ref['labels'])
        torch.testing.assert_close(got['bboxes'], ref['bboxes'], rtol=0,
                                   atol=1e-3)


def test_int8_detector_is_measured_and_refused_where_it_loses(
        exported_detector, tmp_path):
    """The INT8 file of the detector, calibrated on the first two test
    images, measured with COCO bbox and segm mAP against the fp32 file on
    the two others: refused where it loses more than the tolerance (the
    paragraph names both figures, no file is left), written within it;
    XCA's products of two activations and the layers named stay in
    floating point."""
    from mmengine.config import Config

    from xcit_dense.deploy import quantization
    from xcit_dense.deploy.runtimes import read_metadata
    config, out = exported_detector[0], exported_detector[3]
    cfg = Config.fromfile(str(config))
    data = quantization.int8_data(cfg, 2, 100, (96, 128), dynamic=True)
    assert [im.shape for im in data['calibration']] == [(1, 3, 128, 128)] * 2
    assert list(data['held_out']) == [2, 3]  # all the others: the set is small
    # annotations the fp32 file finds (a random detector finds none of the
    # dataset's), of which only the held-out images' may count
    cfg.test_evaluator.ann_file = fp32_annotations(out, data['dataset'],
                                                   tmp_path / 'fp32')
    int8 = tmp_path / 'mask_rcnn.int8.onnx'
    with pytest.raises(ExportError) as refused:
        quantization.export_int8(str(out), str(int8), cfg, log=print, **data)
    found = re.search(r'bbox_mAP 100.00 with the fp32 file, (\d+\.\d+) with '
                      r'the INT8 one', str(refused.value))
    assert found and float(found[1]) < 99, str(refused.value)
    assert str(refused.value).startswith(
        'The INT8 model loses more than --int8-tolerance 1 point on 2 '
        'held-out images of the test dataset (items 2 to 3), against its '
        'annotations (CocoMetric, ')
    assert 'Calibrate on more images (--calib)' in str(refused.value)
    assert list(tmp_path.glob('*.onnx')) == []  # nothing half-written
    # without annotations the fp32 file's predictions are the reference;
    # a larger tolerance accepts the loss
    cfg.test_evaluator = None
    lines = []
    row = quantization.export_int8(str(out), str(int8), cfg, tolerance=100,
                                   log=lines.append, **data)
    assert lines[1] == (
        'INT8 vs fp32 on 2 held-out images of the test dataset (items 2 to '
        "3), against the fp32 file's predictions (the config has no "
        'test_evaluator):')
    assert lines[2].startswith('  fp32  coco/bbox_mAP: 1.0000  ')
    assert 'coco/segm_mAP: 1.0000' in lines[2]
    assert lines[3].startswith('  INT8  coco/bbox_mAP: ')
    bbox = row['losses']['bbox_mAP']
    assert bbox[0] == 100 and 0 <= bbox[1] < 99 and bbox[2] == 100 - bbox[1]
    assert lines[4].startswith(f'  lost: bbox_mAP {bbox[2]:.2f} points')
    fp32 = onnx.load(str(out))
    check_float_nodes(onnx.load(str(int8)), fp32, row['float_nodes'])
    assert read_metadata(str(int8)) == read_metadata(str(out))
    # the layers of the modules --int8-keep-float names
    mask_head = quantization.nodes_in_modules(fp32, ['roi_head.mask_head'])
    assert len(mask_head) == 4 + 1 + 1  # convs, upsample, conv_logits
    with pytest.raises(UserError, match='--int8-keep-float roi_head.nope: '
                       'no layer'):
        quantization.nodes_in_modules(fp32, ['roi_head', 'roi_head.nope'])


def fp32_annotations(out, dataset, prefix):
    """A COCO annotation file of the confident detections (boxes, labels,
    masks) that the exported file ``out`` finds on every image of
    ``dataset``, written as mmdet's ``CocoMetric`` writes ground truth."""
    from mmdet.evaluation import CocoMetric

    from xcit_dense.deploy import load_exported
    from xcit_dense.deploy.int8_check import as_reference
    reference, gts = load_exported(str(out)), []
    for i in range(len(dataset)):
        item = dataset[i]
        sample = reference.infer(item['inputs'], item['data_samples'])
        as_reference(sample, [sample])
        gts.append(dict(img_id=sample.img_id, width=sample.ori_shape[1],
                        height=sample.ori_shape[0], anns=sample.instances))
    metric = CocoMetric()
    metric.dataset_meta = dataset.metainfo
    return metric.gt_to_coco_json(gts, str(prefix))


def check_float_nodes(quantized, fp32, float_nodes):
    """The INT8 graph ``quantized`` of ``fp32`` runs its linear layers on
    dequantized INT8 values and ``float_nodes`` in floating point: XCA's
    products of two activations, the positional encoding's projection,
    the first convolution and the heads' last layers."""
    from xcit_dense.deploy import quantization
    types = [n.op_type for n in quantized.graph.node]
    assert 'QuantizeLinear' in types and 'DequantizeLinear' in types
    products = quantization.float_matmuls(fp32)  # q k^T, attn v per block
    assert len(products) == 2 * TINY['depth']
    encoding = quantization.size_only_nodes(fp32)  # the projection
    assert len(encoding) == 1
    # the RPN's scores and offsets on each of 5 levels, the box head's
    # scores and offsets, the mask logits
    heads = quantization.prediction_layers(fp32)
    assert len(heads) == 2 * 5 + 3
    first = quantization.first_layers(fp32)  # the stem's first convolution
    assert len(first) == 1 and first[0] not in encoding
    assert sorted(float_nodes) == sorted(products + encoding + first + heads)
    dequantized = {o for n in quantized.graph.node for o in n.output
                   if n.op_type == 'DequantizeLinear'}
    found = [n for n in quantized.graph.node if n.name in float_nodes]
    assert len(found) == len(float_nodes)
    assert not any(set(n.input) & dequantized for n in found)
    assert any(set(n.input) & dequantized for n in quantized.graph.node
               if n.op_type == 'MatMul')  # the linear layers are INT8


def test_backbone_and_neck_of_a_detector(tmp_path):
    config = tmp_path / 'mask_rcnn.py'
    config.write_text(MASK_RCNN)
    out = tmp_path / 'feats.onnx'
    proc = run_tool_here('tools/export_onnx.py', config, '--out', out,
                         '--shape', 64, 96, '--backbone-and-neck')
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [o.name for o in onnx.load(str(out)).graph.output] == [
        f'feat{i}' for i in range(5)]


def test_pasted_masks_are_mmdets():
    from mmdet.models.roi_heads.mask_heads.fcn_mask_head import (
        _do_paste_mask,
    )
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(6, 28, 28, generator=gen)
    corners = torch.rand(6, 2, generator=gen) * torch.tensor([60., 40.])
    sizes = torch.rand(6, 2, generator=gen) * 50
    boxes = torch.cat([corners, corners + sizes], dim=1)
    boxes[0, 2] = boxes[0, 0]  # no width
    boxes[1] = torch.tensor([-5., -3., 90., 70.])  # beyond the image
    masks = paste_masks(probs, boxes, 48, 72, threshold=0.5)
    for i in range(6):
        pasted, where = _do_paste_mask(probs[i][None, None], boxes[i:i + 1],
                                       48, 72, skip_empty=True)
        expected = torch.zeros(48, 72, dtype=torch.bool)
        expected[where] = pasted[0] >= 0.5
        assert torch.equal(masks[i], expected), i
    assert masks[2:].any()


def detections(boxes, scores, labels, size=(40, 60)):
    boxes = torch.tensor(boxes, dtype=torch.float32)
    probs = torch.ones(len(boxes), 28, 28)
    masks = paste_masks(probs, boxes, *size)
    return ([boxes.numpy(), np.array(scores, np.float32),
             np.array(labels, np.int64), probs.numpy()],
            dict(boxes=boxes, scores=torch.tensor(scores),
                 labels=torch.tensor(labels), masks=masks))


def test_detections_are_matched_and_only_ties_excused():
    outputs, ref = detections([[1, 1, 20, 20], [30, 5, 50, 30]], [0.9, 0.6],
                              [0, 1])
    row = compare_detections(outputs, ref, (40, 60), 0.05, 100, 0.5)
    assert (row['matched'], row['ties'], row['min_mask_iou']) == (2, 0, 1.0)
    # a detection missing from the export, not at a tie
    missing = [o[:1] for o in outputs]
    with pytest.raises(ExportError, match='PyTorch finds an object the '
                       'other does not.*label 1, score 0.600000'):
        compare_detections(missing, ref, (40, 60), 0.05, 100, 0.5)
    # ... at the score threshold, or tying with another of its label
    _, at_thr = detections([[1, 1, 20, 20], [30, 5, 50, 30]], [0.9, 0.05],
                           [0, 1])
    assert compare_detections(missing, at_thr, (40, 60), 0.05, 100,
                              0.5)['ties'] == 1
    _, tied = detections([[1, 1, 20, 20], [30, 5, 50, 30]], [0.6, 0.6],
                         [1, 1])
    tied_out = [o[:1] for o in detections([[1, 1, 20, 20]], [0.6], [1])[0]]
    assert compare_detections(tied_out, tied, (40, 60), 0.05, 100,
                              0.5)['ties'] == 1
    # a box moved, a label changed, a mask emptied
    for change in ('box', 'label', 'mask'):
        bad = [o.copy() for o in outputs]
        if change == 'box':
            bad[0][1] += 3
        elif change == 'label':
            bad[2][1] = 2
        else:
            bad[3][0] = 0
        message = 'mask overlaps' if change == 'mask' else 'finds an object'
        with pytest.raises(ExportError, match=message):
            compare_detections(bad, ref, (40, 60), 0.05, 100, 0.5)


def test_a_detector_file_that_differs_is_caught(exported_detector,
                                                 tmp_path):
    """The exported file with its boxes moved 3 px: the verification
    against mmdet's predict finds the difference."""
    model, out = exported_detector[2:4]
    proto = onnx.load(str(out))
    for node in proto.graph.node:  # 'boxes' is renamed where it is made
        for names in (node.input, node.output):  # and where it is used
            for i, name in enumerate(names):
                if name == 'boxes':
                    names[i] = 'boxes_unshifted'
    proto.graph.node.extend([
        onnx.helper.make_node('Constant', [], ['three'],
                              value=onnx.numpy_helper.from_array(
                                  np.array(3, np.float32))),
        onnx.helper.make_node('Add', ['boxes_unshifted', 'three'],
                              ['boxes'])])
    shifted = tmp_path / 'shifted.onnx'
    onnx.save(proto, str(shifted))
    with pytest.raises(ExportError, match='The exported detector is wrong: '
                       'at 64x64 PyTorch finds an object the other does not'):
        verify_onnx(str(shifted), DetectorGraph(model), 1, [(64, 64)],
                    log=lambda _: None)
