"""Export an XCiT detector's or segmentor's graph to ONNX, verified.

    python tools/export_onnx.py CONFIG [CHECKPOINT] --out FILE \\
        [--shape H W] [--backbone-only] [--dynamic]

What is exported (see xcit_dense/deploy/graphs.py, detector_graph.py):
  mmseg configs   the whole segmentor: image (N, 3, H, W) pixel values as
                  LoadImageFromFile gives them (BGR, 0-255) in; seg_logits
                  (N, classes, H, W) and seg_labels (N, H, W) out, as mmseg
                  predicts them for an unpadded image;
  mmdet configs   the whole Mask R-CNN, one image: pixel values (1, 3, H, W)
                  after the test pipeline's Resize in; boxes (K, 4), scores
                  (K), labels (K) and mask_probs (K, 28, 28) out, with the
                  config's test thresholds, standard ONNX operators only
                  (NonMaxSuppression, RoiAlign, TopK); masks are pasted into
                  the image outside the graph (xcit_dense.deploy.paste_masks,
                  which tools/demo.py uses);
  --backbone-and-neck  a detector's backbone and neck (the FPN levels), on
                  the normalised input of the data preprocessor;
  --backbone-only the XCiT pyramid (4 maps, strides 4-32), normalised input.

The graph is traced from the modules' straightforward computation (the same
``fast_path(False)`` switch the tests use). Before the file is written under
its name, onnxruntime must reproduce PyTorch on the export size and, with
--dynamic, on two more sizes (one odd): largest difference at most 1e-4 of
the largest value, labels equal; a whole detector is checked against mmdet's
own predict (detections matched by label, box IoU >= 0.99, scores within
1e-4, mask IoU >= 0.98; unmatched ones only at score ties) on those sizes'
synthetic images and on up to 4 images of the config's test dataset (as its
pipeline gives them; with a fixed size, those of that size), or 4 more
synthetic images where there is no dataset. --dynamic works
for every graph. Without CHECKPOINT the weights are the config's
initialisation (random), e.g. to measure speed.

--int8 also writes FILE.int8.onnx (xcit_dense/deploy/quantization.py),
calibrated on the first --calib images of the test dataset; the INT8 and
the fp32 file are measured on the next --int8-images with the config's
test_evaluator (COCO bbox and segm mAP, or mIoU; without annotations,
against the fp32 file's predictions), and the INT8 file is written only if
it loses at most --int8-tolerance points.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import torch  # noqa: E402

from xcit_dense.cli import (  # noqa: E402
    add_cfg_options,
    check_output,
    load_config,
    run_cli,
)
from xcit_dense.deploy import (  # noqa: E402
    check_requirements,
    export_onnx,
    graph_for,
    random_input,
)
from xcit_dense.deploy.onnx_export import (  # noqa: E402
    MIN_OPSET,
    check_detector_batch,
)
from xcit_dense.deploy.quantization import (  # noqa: E402
    TOLERANCE,
    check_float_modules,
    dataset_images,
    export_int8,
    int8_data,
    test_dataset,
)
from xcit_dense.errors import UserError  # noqa: E402
from xcit_dense.inference import init_model  # noqa: E402
from xcit_dense.preflight import (  # noqa: E402
    check_checkpoint,
    check_datasets,
    check_evaluators,
)
from xcit_dense.toolkits import type_name  # noqa: E402

DEFAULT_SHAPE = {'mmdet': (800, 1344), 'mmseg': (512, 512)}
DETECTOR_CHECK_IMAGES = 4
#: --int8's defaults: calibration images, held-out images measured at most
CALIB_IMAGES, INT8_IMAGES = 32, 100
#: options that only --int8 uses, and their defaults
INT8_OPTIONS = {'calib': CALIB_IMAGES, 'int8_images': INT8_IMAGES,
                'int8_tolerance': TOLERANCE, 'int8_keep_float': ()}


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split('\n\n', 2)[2])
    parser.add_argument('config', help='config file or model name')
    parser.add_argument(
        'checkpoint', nargs='?', help='checkpoint file or http(s) URL (ours, '
        'or a published XCiT detector / segmentor); none: the config\'s '
        'initialisation')
    parser.add_argument('--out', required=True, help='ONNX file to write')
    parser.add_argument(
        '--shape', type=int, nargs=2, metavar=('H', 'W'),
        help='input height and width (default: for a whole detector the '
        'largest image its test pipeline\'s Resize gives, 800 1333 for '
        'COCO\'s; for a detector\'s backbone and neck 800 1344; for mmseg '
        'configs the crop size, or 512 512)')
    parser.add_argument('--batch', type=int, default=1,
                        help='images per call (fixed in the graph)')
    parts = parser.add_mutually_exclusive_group()
    parts.add_argument('--backbone-only', action='store_true',
                       help='export the backbone\'s pyramid alone')
    parts.add_argument('--backbone-and-neck', action='store_true',
                       help='mmdet configs: export the backbone and neck '
                       '(the FPN levels) instead of the whole detector')
    parser.add_argument('--dynamic', action='store_true',
                        help='free input height and width')
    parser.add_argument('--opset', type=int, default=MIN_OPSET,
                        help=f'ONNX opset version (default and least: '
                        f'{MIN_OPSET}, what PyTorch\'s exporter writes)')
    add_int8_options(parser)
    add_cfg_options(parser)
    return parser.parse_args()


def add_int8_options(parser):
    parser.add_argument(
        '--int8', action='store_true',
        help='also write FILE.int8.onnx: the whole model quantized to INT8 '
        '(static, calibrated on --calib images of the config\'s test '
        'dataset), written only if its mAP / mIoU on the next '
        '--int8-images images is within --int8-tolerance of the fp32 '
        'file\'s')
    parser.add_argument('--calib', type=int, help='calibration images for '
                        f'--int8 (default: {CALIB_IMAGES})')
    parser.add_argument(
        '--int8-images', type=int, metavar='N',
        help='test images after the calibration ones that the INT8 and the '
        f'fp32 file are measured on (default: all of them, at most '
        f'{INT8_IMAGES})')
    parser.add_argument(
        '--int8-tolerance', type=float, metavar='POINTS',
        help='points the INT8 file may lose against the fp32 file: of COCO '
        'bbox and of segm mAP (x100) for a detector, of mIoU for a '
        f'segmentor (default: {TOLERANCE:g})')
    parser.add_argument(
        '--int8-keep-float', nargs='+', metavar='MODULE',
        help='modules whose layers stay in floating point in the INT8 file, '
        'named as in the model (e.g. backbone.patch_embed '
        'roi_head.mask_head decode_head)')


def main():
    args = parse_args()
    cfg = load_config(args.config, args.cfg_options)
    scope, whole_detector = check_args(args, cfg)
    if args.shape:
        height, width = args.shape
    else:
        (height, width), why = default_shape(cfg, scope, whole_detector)
        print(f'exporting at {height}x{width} ({why}; --shape H W for '
              f'another size{"" if args.dynamic else ", --dynamic for any"})')
    check_size(args, height, width, whole_detector)
    int8 = None
    if args.int8:
        check_datasets(cfg, ('test', ))
        check_evaluators(cfg, ('test', ))
        int8 = int8_data(cfg, args.calib, args.int8_images, (height, width),
                         args.dynamic)
    checkpoint = None
    if args.checkpoint is not None:
        checkpoint = check_checkpoint(args.checkpoint, 'checkpoint')
    else:
        print('no checkpoint given: exporting the config\'s initial '
              '(random) weights')
    check_requirements()
    model = init_model(cfg, checkpoint)
    check_float_modules(model, args.int8_keep_float)
    graph = graph_for(model, scope, args.backbone_only,
                      args.backbone_and_neck)
    export_verified(args, cfg, graph, (height, width), whole_detector,
                    int8['calibration'] if int8 else None)
    if args.int8:  # next to the fp32 file, which it is measured against
        int8_path = args.out[:-len('.onnx')] + '.int8.onnx'
        export_int8(args.out, int8_path, cfg, tolerance=args.int8_tolerance,
                    float_modules=args.int8_keep_float, **int8)
        print(f'wrote {int8_path}')


def check_args(args, cfg):
    """The command line's checks that need no model: returns the config's
    scope and whether the graph is a whole detector."""
    scope = cfg.get('default_scope')
    if scope not in DEFAULT_SHAPE:
        raise UserError(f'The config has default_scope={scope!r}; '
                        'export_onnx.py takes mmdet or mmseg configs.')
    if not args.out.endswith('.onnx'):
        raise UserError(f'--out must name an .onnx file, got {args.out}')
    check_output(args.out, '--out')
    if args.opset < MIN_OPSET:
        raise UserError(
            f'--opset {args.opset}: PyTorch\'s ONNX exporter writes opset '
            f'{MIN_OPSET} or later (it cannot convert these graphs to an '
            f'earlier one); give --opset {MIN_OPSET} or more.')
    if args.backbone_and_neck and scope != 'mmdet':
        raise UserError('--backbone-and-neck is for mmdet configs (a '
                        'detector\'s FPN); this config is an mmseg one: '
                        'export the whole segmentor, or --backbone-only.')
    check_int8_args(args)
    return scope, scope == 'mmdet' and not (args.backbone_only or
                                            args.backbone_and_neck)


def check_int8_args(args):
    """--int8's options: given only with it, in range; their defaults."""
    given = [name for name in INT8_OPTIONS if getattr(args, name) is not None]
    if given and not args.int8:
        flag = '--' + given[0].replace('_', '-')
        what = ('the number of calibration images of --int8' if
                given[0] == 'calib' else 'an option of --int8')
        raise UserError(f'{flag} is {what}; give --int8 too, or leave '
                        f'{flag} out.')
    for name, default in INT8_OPTIONS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if not args.int8:
        return
    if args.backbone_only or args.backbone_and_neck:
        raise UserError('--int8 quantizes a whole segmentor or detector '
                        '(calibrated and measured on its predictions); '
                        'leave out --backbone-only / --backbone-and-neck.')
    for flag, value, least in (('--calib', args.calib, 1),
                               ('--int8-images', args.int8_images, 1),
                               ('--int8-tolerance', args.int8_tolerance, 0)):
        if value < least:
            raise UserError(f'{flag} must be at least {least}, got {value}.')


def check_size(args, height: int, width: int, whole_detector: bool):
    if min(height, width) < 32 or args.batch < 1:
        raise UserError(f'--shape must be at least 32 32 and --batch at '
                        f'least 1, got --shape {height} {width} --batch '
                        f'{args.batch}.')
    if whole_detector:
        check_detector_batch(args.batch)


def export_verified(args, cfg, graph, size, whole_detector: bool,
                    calibration=None):
    """Export ``graph`` to ``--out``, verified against PyTorch (a whole
    detector on images of the test dataset too: the first calibration
    images where --int8 has read them), and say so."""
    check_images, source = [], None
    if whole_detector:
        check_images, source = detector_check_images(
            cfg, size, args.dynamic, loaded=calibration)
    rows = export_onnx(graph, args.out, args.batch, *size,
                       dynamic=args.dynamic, opset=args.opset,
                       images=check_images)
    sizes = ', '.join(dict.fromkeys(f'{h}x{w}' for h, w in
                                    (r['size'] for r in rows)))
    if whole_detector:
        found = sum(r['detections'] for r in rows)
        matched = sum(r['matched'] for r in rows)
        print(f'verified with onnxruntime against mmdet predict on '
              f'{len(rows)} images ({len(check_images)} of them {source}) '
              f'at {sizes}: {matched} of {found} detections matched; wrote '
              f'{args.out}')
    else:
        worst = max(r.get('max_rel_diff', 0.) for r in rows)
        print(f'verified with onnxruntime at {sizes}: largest difference '
              f'{worst:.1e} of the largest value; wrote {args.out}')


def default_shape(cfg, scope: str, whole_detector: bool):
    """The export size when ``--shape`` is not given, and why: for a whole
    detector, the largest image the test pipeline's ``Resize`` gives (its
    ``scale`` as (H, W) without ``keep_ratio``; with it, a landscape image
    at both limits: 800x1333 for COCO's (1333, 800), 128x128 for the
    demo's (128, 128)), as the graph takes images before the padding;
    for mmseg configs the crop size; otherwise :data:`DEFAULT_SHAPE`
    (COCO's 800x1333 padded to 32, as the backbone and neck take it)."""
    if scope == 'mmseg' and cfg.get('crop_size'):
        return tuple(cfg.crop_size), 'the config\'s crop_size'
    resize = test_resize(cfg) if whole_detector else None
    if resize is not None:
        scale = tuple(resize['scale'])
        if resize.get('keep_ratio'):
            return (min(scale), max(scale)), (
                f'the largest image of the test pipeline\'s Resize, scale='
                f'{scale} with keep_ratio')
        return (scale[1], scale[0]), (
            f'the test pipeline\'s Resize, scale={scale} (W, H)')
    return DEFAULT_SHAPE[scope], 'the default'


def test_resize(cfg):
    """The test pipeline's one ``Resize`` to a fixed ``scale`` (the
    pipeline recorded in the exported file), or None."""
    pipeline = cfg.get('test_pipeline') or (
        cfg.get('test_dataloader') or {}).get('dataset', {}).get('pipeline')
    resizes = [t for t in pipeline or []
               if type_name(t) == 'Resize']
    if len(resizes) != 1:
        return None
    scale = resizes[0].get('scale')
    if isinstance(scale, int):
        scale = (scale, scale)
    if not (isinstance(scale, (tuple, list)) and len(scale) == 2
            and all(isinstance(s, int) and s > 0 for s in scale)):
        return None
    return dict(resizes[0], scale=tuple(scale))


def detector_check_images(cfg, size, dynamic: bool, loaded=None):
    """What a whole detector's export is checked on besides the synthetic
    image of each verification size: the first :data:`DETECTOR_CHECK_IMAGES`
    images of the config's test dataset where it exists (as its pipeline
    gives them, or of ``loaded``, its first images when ``--int8`` has
    read them; with a fixed export size, those of that size), else as many
    more synthetic images of the export size. Returns the images and where
    they come from."""
    if loaded is None:
        try:
            check_datasets(cfg, ('test', ))
            loaded = dataset_images(test_dataset(cfg),
                                    DETECTOR_CHECK_IMAGES)
        except UserError:  # no dataset here: synthetic images
            loaded = []
    images = [torch.from_numpy(im) for im in loaded[:DETECTOR_CHECK_IMAGES]
              if dynamic or tuple(im.shape[-2:]) == tuple(size)]
    if images:
        return images, 'from the test dataset'
    return [random_input(1, 3, *size, images=True, seed=seed)
            for seed in range(1, DETECTOR_CHECK_IMAGES + 1)], 'synthetic'


if __name__ == '__main__':
    run_cli(main)
