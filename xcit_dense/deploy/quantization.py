"""INT8 post-training static quantization of an exported whole model with
onnxruntime's quantization tools, calibrated on images of the config's
dataset, and measured against the fp32 file on other images of it
(:mod:`.int8_check`).

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
  one product moves every weight of its row (quantized, they cost the COCO
  demo model bbox mAP);
* the heads' last layers (``prediction_layers``: mmdet's ``rpn_cls``,
  ``rpn_reg``, ``fc_cls``, ``fc_reg``, ``conv_logits``, mmseg's
  ``conv_seg``), a few small layers whose outputs are the scores and box
  offsets themselves: quantized, they cost the COCO demo model bbox mAP
  and some of the fp32 model's detections;
* the first layer that reads the image (``first_layers``: the stem's first
  convolution, ``patch_embed.proj.0``), by the same rule as the last ones:
  quantized, that one convolution cost the COCO demo models more bbox mAP
  than every other layer together;
* the layers of the modules the user names (``--int8-keep-float``);
* every operator that is not in ``QUANTIZED_OPS``: XCA's L2 normalisation
  and softmax, LayerNorm, GELU, the Fourier positional encoding, and all of
  the detector's post-processing (box decoding, ``TopK``,
  ``NonMaxSuppression``, ``RoiAlign``), whose outputs are coordinates.
"""
from typing import Dict, List, Sequence

import numpy as np

from ..atomic_files import move_into_place, unverified_file
from ..errors import ExportError, UserError

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


def module_scopes(node) -> List[str]:
    """The modules a node runs in, outermost first, as the model names them
    (``backbone.blocks.0.attn``): the name scopes the exporter records with
    each node, without the exported graph's own ``model.``."""
    import ast
    meta = {p.key: p.value for p in node.metadata_props}
    scopes = ast.literal_eval(meta.get('pkg.torch.onnx.name_scopes', '[]'))
    return [s[len('model.'):] if s.startswith('model.') else s
            for s in scopes]


def prediction_layers(model) -> List[str]:
    """The nodes of ``QUANTIZED_OPS`` that run a head's last layer
    (:data:`PREDICTION_LAYERS`), found by the module name the exporter
    records with each node."""
    found = []
    for node in model.graph.node:
        scopes = module_scopes(node)
        if node.op_type in QUANTIZED_OPS and len(scopes) >= 2 and \
                scopes[-2].split('.')[-1] in PREDICTION_LAYERS:
            found.append(node.name)
    return found


#: how --int8-keep-float names modules
MODULE_NAMES = ('Name modules as the model does (its state_dict\'s keys '
                'without the parameter), e.g. backbone.patch_embed, '
                'backbone.blocks.0, neck, roi_head.mask_head, decode_head.')


def check_float_modules(model, names: Sequence[str]) -> None:
    """Every name of ``--int8-keep-float`` is one of ``model``'s modules
    (checked before the export, which the quantization follows)."""
    unknown = [n for n in names if n not in dict(model.named_modules())]
    if unknown:
        raise UserError(
            f'--int8-keep-float {" ".join(unknown)}: the model has no module '
            f'of {"that name" if len(unknown) == 1 else "those names"}. '
            + MODULE_NAMES)


def nodes_in_modules(model, modules: Sequence[str]) -> List[str]:
    """The nodes of ``QUANTIZED_OPS`` that run in one of ``modules`` (the
    model's module names, ``backbone.patch_embed``, ``roi_head``) or in a
    module inside one; :class:`UserError` for a name that runs no such
    node."""
    found = {name: [] for name in modules}
    for node in model.graph.node:
        if node.op_type not in QUANTIZED_OPS:
            continue
        scopes = module_scopes(node)
        for name in modules:
            if any(s == name or s.startswith(name + '.') for s in scopes):
                found[name].append(node.name)
    missing = [name for name, nodes in found.items() if not nodes]
    if missing:
        raise UserError(
            f'--int8-keep-float {" ".join(missing)}: no layer of the model '
            'that INT8 quantizes (' + ', '.join(QUANTIZED_OPS) + ') runs in '
            f'{"that module" if len(missing) == 1 else "those modules"}. '
            + MODULE_NAMES)
    return list(dict.fromkeys(n for nodes in found.values() for n in nodes))


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


def test_dataset(cfg):
    """The config's test dataset, built as mmengine's test loop builds it."""
    from ..toolkits import use_toolkit
    datasets = use_toolkit(cfg.default_scope).DATASETS
    return datasets.build(cfg.test_dataloader.dataset)


def dataset_images(dataset, count: int) -> List[np.ndarray]:
    """The first ``count`` images of ``dataset`` (a config's test dataset,
    :func:`test_dataset`) as its test pipeline gives them, each
    ``(1, 3, H, W)`` float32: what the exported whole model takes."""
    return [dataset[i]['inputs'][None].float().numpy()
            for i in range(min(count, len(dataset)))]


def int8_data(cfg, calib: int, count: int, size, dynamic: bool) -> Dict:
    """The data of ``--int8``, read before the export: the config's test
    dataset, its first ``calib`` images to calibrate on and the items after
    them (at most ``count``) that the INT8 file is measured on."""
    dataset = test_dataset(cfg)
    if len(dataset) <= calib:
        raise UserError(
            f'The test dataset has {len(dataset)} images: --calib {calib} '
            'must leave at least one to measure the INT8 model on.')
    calibration = dataset_images(dataset, calib)
    other = {im.shape[-2:] for im in calibration} - {tuple(size)}
    if other and not dynamic:
        raise UserError(
            f'The test pipeline gives images of {sorted(other)[0]} and the '
            f'export is fixed at {size[0]}x{size[1]}: export with --dynamic '
            'to quantize (the calibration runs the file on the dataset\'s '
            'images), or give --shape the images\' size.')
    held_out = range(calib, min(len(dataset), calib + count))
    return dict(dataset=dataset, calibration=calibration, held_out=held_out)


def quantize_int8(fp32_path: str, int8_path: str,
                  images: Sequence[np.ndarray],
                  float_modules: Sequence[str] = ()) -> List[str]:
    """Write the INT8 model of ``fp32_path`` to ``int8_path``, calibrated on
    ``images`` (the exported graph's inputs), with the fp32 file's metadata;
    the layers of the modules named in ``float_modules`` stay in floating
    point, besides those listed above. Returns the nodes kept in floating
    point among those of ``QUANTIZED_OPS``."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    model = onnx.load(fp32_path)
    keep_float = list(dict.fromkeys(
        float_matmuls(model) + size_only_nodes(model) + first_layers(model) +
        prediction_layers(model) + nodes_in_modules(model, float_modules)))
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


#: the points of mAP / mIoU an INT8 file may lose (--int8-tolerance)
TOLERANCE = 1.0


def export_int8(fp32_path: str, int8_path: str, cfg, dataset,
                calibration: Sequence[np.ndarray], held_out: Sequence[int],
                tolerance: float = TOLERANCE,
                float_modules: Sequence[str] = (), log=print) -> Dict:
    """Quantize the verified fp32 file, calibrated on the ``calibration``
    images (the first items of ``dataset``, the config's test dataset),
    measure both files on the items ``held_out`` (others than those)
    (:mod:`.int8_check`) and only where the INT8 file loses at most
    ``tolerance`` points move it to ``int8_path``. Returns both files'
    results, the gated figures and the nodes kept in floating point."""
    from .int8_check import check_loss, measure
    scope = cfg.default_scope
    with unverified_file(int8_path, '.onnx') as partial:
        keep_float = quantize_int8(fp32_path, partial, calibration,
                                   float_modules)
        log(f'quantized to INT8 on {len(calibration)} calibration images; '
            f'kept in floating point: {len(keep_float)} nodes (XCA\'s '
            'products of two activations, the positional encoding\'s '
            'projection, the first convolution, the heads\' last layers'
            + (', ' + ', '.join(float_modules) if float_modules else '')
            + ') and every operator but ' + ', '.join(QUANTIZED_OPS))
        measured = measure(cfg, scope, dataset, held_out, fp32_path, partial)
        where = (f'{len(held_out)} held-out images of the test dataset '
                 f'(items {held_out[0]} to {held_out[-1]}), against '
                 f'{measured["against"]}')
        log(f'INT8 vs fp32 on {where}:')
        rows = check_loss(measured, scope, tolerance, where, log)
        move_into_place(partial, int8_path)
    return dict(measured, losses=rows, float_nodes=keep_float)
