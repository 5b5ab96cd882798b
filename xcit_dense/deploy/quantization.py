"""INT8 post-training static quantization of an exported whole model with
onnxruntime's quantization tools, calibrated on images of the config's
dataset, and checked against the fp32 file on other images of it.

What is quantized: the layers with weights (``Conv``, ``ConvTranspose``,
``MatMul`` / ``Gemm`` of linear layers), weights per output channel (int8),
activations per tensor (uint8, ranges from the calibration images), in QDQ
form. What stays in floating point, and why:

* the Fourier positional encoding's projection (``size_only_nodes``),
  computed from the image's size, not its pixels;
* XCA's two products of activations, ``q k^T`` and ``attn v``
  (``float_matmuls``): both operands are computed, so both would need
  calibrated ranges, and the attention over channels is a softmax of
  L2-normalised products scaled by a learned temperature, where an error in
  one product moves every weight of its row (measured on the COCO demo:
  quantizing them as well costs 0.006 more bbox mAP, 0.309 against 0.315;
  on the ADE20K demo nothing, mIoU 46.68 against 46.66);
* the heads' last layers (``prediction_layers``: mmdet's ``rpn_cls``,
  ``rpn_reg``, ``fc_cls``, ``fc_reg``, ``conv_logits``, mmseg's
  ``conv_seg``), a few small layers whose outputs are the scores and box
  offsets themselves: measured on the COCO demo (100 images), quantizing
  them too costs 0.003 more bbox mAP (0.312 against 0.315, fp32 0.319) and
  finds fewer of the fp32 model's detections (88.7 % against 90.3 % at box
  IoU >= 0.75);
* the first layer that reads the image (``first_layers``: the stem's first
  convolution, ``patch_embed.proj.0``), by the same rule as the last ones:
  on the COCO demo trained with seed 1 (bbox mAP 0.304 in fp32) quantizing
  that one convolution alone cost 0.12 bbox mAP (0.185), every other layer
  together nothing (0.319); the checkpoint of issue 29's report, 0.298 in
  fp32, lost 0.05 with it quantized;
* every operator that is not in ``QUANTIZED_OPS``: XCA's L2 normalisation
  and softmax, LayerNorm, GELU, the Fourier positional encoding, and all of
  the detector's post-processing (box decoding, ``TopK``,
  ``NonMaxSuppression``, ``RoiAlign``), whose outputs are coordinates.
"""
from typing import Dict, List, Sequence

import numpy as np

from ..atomic_files import move_into_place, unverified_file
from ..errors import ExportError

QUANTIZED_OPS = ('Conv', 'ConvTranspose', 'MatMul', 'Gemm')


def float_matmuls(model) -> List[str]:
    """The ``MatMul`` nodes of ``model`` (an ``onnx.ModelProto``) whose
    operands are both computed, no weight: XCA's ``q k^T`` and
    ``attn v``."""
    constants = {i.name for i in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == 'Constant'
                  for o in n.output}
    return [n.name for n in model.graph.node if n.op_type == 'MatMul'
            and not any(i in constants for i in n.input)]


#: mmdet's and mmseg's names of the heads' last layers, which give scores,
#: box offsets and mask logits
PREDICTION_LAYERS = ('rpn_cls', 'rpn_reg', 'fc_cls', 'fc_reg', 'conv_logits',
                     'conv_seg')


def prediction_layers(model) -> List[str]:
    """The nodes of ``QUANTIZED_OPS`` that run a head's last layer
    (:data:`PREDICTION_LAYERS`), found by the module name the exporter
    records with each node."""
    import ast
    found = []
    for node in model.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        scopes = ast.literal_eval(meta.get('pkg.torch.onnx.name_scopes',
                                           '[]'))
        if node.op_type in QUANTIZED_OPS and len(scopes) >= 2 and \
                scopes[-2].split('.')[-1] in PREDICTION_LAYERS:
            found.append(node.name)
    return found


def first_layers(model) -> List[str]:
    """The nodes of ``QUANTIZED_OPS`` that read the image through no other
    of them (in topological order): the stem's first convolution."""
    before = {i.name for i in model.graph.input}
    found = []
    for node in model.graph.node:
        if node.op_type == 'Shape' or not any(i in before
                                              for i in node.input):
            continue
        if node.op_type in QUANTIZED_OPS:
            found.append(node.name)
        else:
            before.update(node.output)
    return found


def size_only_nodes(model) -> List[str]:
    """The nodes of ``QUANTIZED_OPS`` whose inputs depend on the image's
    size alone, not on its pixels: the Fourier positional encoding's
    projection. Quantizing them gains nothing (they are computed once per
    size) and OpenVINO cannot compile such a quantized branch."""
    from_pixels = {i.name for i in model.graph.input}
    for node in model.graph.node:  # in topological order
        if node.op_type != 'Shape' and \
                any(i in from_pixels for i in node.input):
            from_pixels.update(node.output)
    return [n.name for n in model.graph.node if n.op_type in QUANTIZED_OPS
            and not any(i in from_pixels for i in n.input)]


def dataset_images(cfg, count: int) -> List[np.ndarray]:
    """The first ``count`` images of the config's test dataset as its test
    pipeline gives them, each ``(1, 3, H, W)`` float32: what the exported
    whole model takes."""
    from ..toolkits import use_toolkit
    datasets = use_toolkit(cfg.default_scope).DATASETS
    dataset = datasets.build(cfg.test_dataloader.dataset)
    return [dataset[i]['inputs'][None].float().numpy()
            for i in range(min(count, len(dataset)))]


def quantize_int8(fp32_path: str, int8_path: str,
                  images: Sequence[np.ndarray]) -> List[str]:
    """Write the INT8 model of ``fp32_path`` to ``int8_path``, calibrated on
    ``images`` (the exported graph's inputs), with the fp32 file's metadata.
    Returns the nodes kept in floating point among those of
    ``QUANTIZED_OPS``."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    model = onnx.load(fp32_path)
    keep_float = (float_matmuls(model) + size_only_nodes(model) +
                  first_layers(model) + prediction_layers(model))
    name = model.graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter(images)

        def get_next(self):
            image = next(self.items, None)
            return None if image is None else {name: image}

    try:
        quantize_static(
            model, int8_path, Reader(), quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(QUANTIZED_OPS), per_channel=True,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
            nodes_to_exclude=keep_float,
            calibrate_method=CalibrationMethod.MinMax)
    except Exception as e:  # onnxruntime's errors have many types
        raise ExportError(f'onnxruntime cannot quantize {fp32_path}: '
                          f'{type(e).__name__}: {e}') from e
    quantized = onnx.load(int8_path)
    del quantized.metadata_props[:]
    quantized.metadata_props.extend(model.metadata_props)
    onnx.save(quantized, int8_path)
    return keep_float


#: the INT8 budget against the fp32 file on the check images: a
#: segmentor's labels agree on this share of pixels; a detector finds this
#: share of the fp32 file's confident detections (score >= CONFIDENT) with
#: the same label and box IoU >= MATCH_IOU
LABEL_AGREEMENT = 0.95
DETECTION_RECALL = 0.9
CONFIDENT, MATCH_IOU = 0.5, 0.5


def compare_int8(int8_path: str, fp32_path: str, graph: str,
                 images: Sequence[np.ndarray]) -> Dict:
    """How the INT8 file's predictions agree with the fp32 file's on
    ``images``: ``agreement`` (pixels with the same label, or confident fp32
    detections found) and whether it is within the budget."""
    import torch
    from torchvision.ops import box_iou

    from .runtimes import runtime_session
    int8, fp32 = (runtime_session('onnxruntime', p)
                  for p in (int8_path, fp32_path))
    agree = total = 0
    for image in images:
        ours, ref = int8(image), fp32(image)
        if graph == 'SegmentorGraph':
            agree += int((ours[1] == ref[1]).sum())
            total += ref[1].size
            continue
        confident = ref[1] >= CONFIDENT
        ref_boxes = torch.from_numpy(ref[0][confident])
        ref_labels = torch.from_numpy(ref[2][confident])
        total += len(ref_boxes)
        if len(ref_boxes) and len(ours[0]):
            iou = box_iou(ref_boxes, torch.from_numpy(ours[0]))
            same = ref_labels[:, None] == torch.from_numpy(ours[2])[None]
            agree += int(((iou >= MATCH_IOU) & same).any(dim=1).sum())
    budget = LABEL_AGREEMENT if graph == 'SegmentorGraph' else \
        DETECTION_RECALL
    agreement = agree / total if total else 1.0
    return dict(agreement=agreement, compared=total, budget=budget,
                within=agreement >= budget)


def export_int8(fp32_path: str, int8_path: str, graph: str,
                calibration: Sequence[np.ndarray],
                check: Sequence[np.ndarray], log=print) -> Dict:
    """Quantize the verified fp32 file, compare the result with it on the
    ``check`` images (other images than the calibration ones) and only
    within the budget move it to ``int8_path``. Returns the comparison with
    the nodes kept in floating point."""
    with unverified_file(int8_path, '.onnx') as partial:
        keep_float = quantize_int8(fp32_path, partial, calibration)
        log(f'quantized to INT8 on {len(calibration)} calibration images; '
            f'kept in floating point: {len(keep_float)} nodes (XCA\'s '
            'products of two activations, the positional encoding\'s '
            'projection, the first convolution, the heads\' last layers) '
            'and every operator but '
            + ', '.join(QUANTIZED_OPS))
        row = compare_int8(partial, fp32_path, graph, check)
        what = ('pixels labelled as by the fp32 file'
                if graph == 'SegmentorGraph' else
                f'fp32 detections scoring >= {CONFIDENT} found (same label, '
                f'box IoU >= {MATCH_IOU})')
        log(f'  INT8 vs fp32 on {len(check)} other images: '
            f'{row["agreement"]:.1%} of {row["compared"]} {what}; budget '
            f'{row["budget"]:.0%}')
        if not row['compared']:
            log('  warning: the fp32 file finds no detection scoring >= '
                f'{CONFIDENT} on these images, so the INT8 file was '
                'checked on nothing (a model that detects nothing yet: '
                'untrained, or random weights); check it with tools/test.py '
                'once it detects')
        if not row['within']:
            raise ExportError(
                f'The INT8 model is outside its accuracy budget: on '
                f'{len(check)} images it agrees with the fp32 model on '
                f'{row["agreement"]:.1%} ({what}), at least '
                f'{row["budget"]:.0%} is required. Calibrate on more '
                'images (--calib) or keep the fp32 file.')
        move_into_place(partial, int8_path)
        return dict(row, float_nodes=keep_float)
