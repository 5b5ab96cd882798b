"""Draw a detector's or segmentor's predictions on an image, or on every
image of a folder.

    python tools/demo.py IMAGE CONFIG CHECKPOINT --out result.jpg
    python tools/demo.py FOLDER CONFIG CHECKPOINT --out drawn/ [--show]
    python tools/demo.py IMAGE MODEL.onnx --out result.jpg \
        [--runtime onnxruntime|openvino]

The config's ``default_scope`` picks mmdet (boxes, masks and labels) or
mmseg (the label map blended over the image). A whole segmentor or detector
exported by tools/export_onnx.py runs on onnxruntime or OpenVINO without
building the mm model: the file records the config's test pipeline, class
names, palette and visualizer (and the mask threshold of a detector, whose
masks are pasted into the image after the graph), and the picture is the
one the PyTorch model draws.
"""
import argparse
import os
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import cv2  # noqa: E402
import mmcv  # noqa: E402

from xcit_dense.cli import (  # noqa: E402
    add_cfg_options,
    check_display,
    check_output,
    load_config,
    run_cli,
    seconds,
    torch_device,
)
from xcit_dense.deploy import RUNTIMES, load_exported  # noqa: E402
from xcit_dense.errors import UserError  # noqa: E402
from xcit_dense.inference import init_model  # noqa: E402
from xcit_dense.preflight import check_checkpoint  # noqa: E402
from xcit_dense.toolkits import use_toolkit  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('image', help='image file, or a folder of images '
                        '(each drawn into the folder --out, under its name)')
    parser.add_argument('config', help='config file, or an .onnx file of a '
                        'segmentor or detector exported by '
                        'tools/export_onnx.py')
    parser.add_argument(
        'checkpoint', nargs='?', help='checkpoint file or http(s) URL (ours, '
        'or a published XCiT detector / segmentor); not with an .onnx file')
    # the names of mmdet's and mmseg's demo/image_demo.py too
    parser.add_argument('--out', '--out-file', dest='out',
                        help="output image file, or a folder (the drawing "
                        "under the image's name; for a folder of images)")
    parser.add_argument('--show', action='store_true',
                        help='show each drawing in a window')
    parser.add_argument('--wait-time', type=seconds, default=0,
                        help='seconds each drawing is shown with --show (0, '
                        'the default: until a key is pressed)')
    parser.add_argument('--device', type=torch_device, default='cpu',
                        help='e.g. cpu, cuda:0')
    parser.add_argument('--score-thr', '--pred-score-thr', dest='score_thr',
                        type=float, default=0.3,
                        help='detection: smallest score drawn')
    parser.add_argument('--opacity', type=float, default=0.5,
                        help='segmentation: opacity of the label map')
    parser.add_argument('--runtime', choices=RUNTIMES,
                        help='the runtime of an .onnx file (default: '
                        'onnxruntime)')
    add_cfg_options(parser)
    args = parser.parse_args()
    if args.out is None and not args.show:
        parser.error('give --out (where the drawing is written), --show (a '
                     'window), or both')
    return args


#: what a folder's images are (mmdet's and mmcv's image extensions)
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif',
                    '.tiff', '.webp')
#: what a drawing is written as (OpenCV writes colour images so; a .pgm is
#: grey only)
DRAWING_EXTENSIONS = tuple(e for e in IMAGE_EXTENSIONS if e != '.pgm')


def drawing_name(name):
    """The file name of the drawing of the image ``name``: its own, or with
    .png added where its format holds no colour drawing."""
    return name if name.lower().endswith(DRAWING_EXTENSIONS) \
        else f'{name}.png'


def images_and_outputs(image, out):
    """(image, drawing) paths: ``image`` and ``out`` (or ``out``/its name
    where ``out`` is a folder, or has no extension), or each image of the
    folder ``image`` (by extension, sorted) and ``out``/its name; no
    drawing path without ``out``."""
    if osp.isdir(image):
        if out is not None and osp.isfile(out):
            raise UserError(f'--out must be a folder for a folder of images; '
                            f'{out} is a file.')
        names = sorted(n for n in os.listdir(image)
                       if n.lower().endswith(IMAGE_EXTENSIONS))
        if not names:
            raise UserError(f'No image in the folder {image} (files ending '
                            f'in {", ".join(IMAGE_EXTENSIONS)}).')
        if out is not None:
            check_output(out, '--out', folder=True)
            os.makedirs(out, exist_ok=True)
        return [(osp.join(image, n), out and osp.join(out, drawing_name(n)))
                for n in names]
    if not osp.isfile(image):
        raise UserError(f'Image not found: {image}')
    if out is not None:
        if osp.isdir(out) or not osp.splitext(out)[1]:
            out = osp.join(out, drawing_name(osp.basename(image)))
        elif not out.lower().endswith(DRAWING_EXTENSIONS):
            raise UserError(
                f'--out {out}: a drawing is written as an image file '
                f'ending in {", ".join(DRAWING_EXTENSIONS)}, or into a '
                "folder (an existing one, or a path without an extension) "
                "under the image's name.")
        check_output(out, '--out')
        os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    return [(image, out)]


def read_image(path):
    """The image at ``path`` in RGB, or one paragraph."""
    try:
        image = mmcv.imread(path, channel_order='rgb')
    except cv2.error:  # mmcv decodes with OpenCV, then converts to RGB
        image = None
    if image is None:
        raise UserError(f'Cannot read {path} as an image (a format '
                        'OpenCV decodes: PNG, JPEG, BMP, TIFF, WebP, ...).')
    return image


def main():
    args = parse_args()
    if args.config.endswith('.onnx'):
        if not osp.isfile(args.config):
            raise UserError(f'ONNX file not found: {args.config}')
        if args.checkpoint is not None:
            raise UserError(f'{args.config} holds its weights: give no '
                            f'CHECKPOINT (got {args.checkpoint}).')
    elif args.checkpoint is None:
        raise UserError('CHECKPOINT is missing: a config needs the '
                        'checkpoint of its trained model (an .onnx file '
                        'needs none).')
    elif args.runtime is not None:
        raise UserError('--runtime chooses the runtime of an .onnx file; a '
                        'config and checkpoint are run by PyTorch.')
    if args.show:
        check_display(instead='--out')
    pairs = images_and_outputs(args.image, args.out)
    first = read_image(pairs[0][0])  # named before the model is built
    if args.config.endswith('.onnx'):
        model = load_exported(args.config, args.runtime or 'onnxruntime')
        visualizer, meta, scope = (model.visualizer_cfg, model.dataset_meta,
                                   model.scope)
        predict, how = model.predict, f' ({model.runtime})'
    else:
        cfg = load_config(args.config, args.cfg_options)
        checkpoint = check_checkpoint(args.checkpoint, 'checkpoint')
        model = init_model(cfg, checkpoint, args.device)
        visualizer, meta, scope = (model.cfg.visualizer, model.dataset_meta,
                                   cfg.default_scope)
        if scope == 'mmdet':
            from mmdet.apis import inference_detector as inference
        else:
            from mmseg.apis import inference_model as inference
        predict, how = (lambda path: inference(model, path)), ''
    visualizer = use_toolkit(scope).VISUALIZERS.build(visualizer)
    visualizer.dataset_meta = meta
    for i, (path, out) in enumerate(pairs):
        image = first if i == 0 else read_image(path)
        draw(args, visualizer, osp.basename(path), image, out,
             predict(path), scope, how)


def draw(args, visualizer, name, image, out, result, scope, how=''):
    """Draw ``result`` with the scope's visualizer as its tools do (boxes
    and masks scoring at least --score-thr, or the label map at --opacity)
    into ``out`` and/or a window titled ``name`` (--show)."""
    where = dict(show=args.show, wait_time=args.wait_time, out_file=out)
    if scope == 'mmdet':
        visualizer.add_datasample(
            name, image, data_sample=result, draw_gt=False,
            pred_score_thr=args.score_thr, **where)
        n = int((result.pred_instances.scores >= args.score_thr).sum())
        what = f'{n} objects with score >= {args.score_thr}{how}'
    else:
        visualizer.alpha = args.opacity
        visualizer.add_datasample(name, image, data_sample=result,
                                  draw_gt=False, **where)
        what = f'label map{how}'
    done = ([f'drawn to {out}'] if out else []) + \
        (['shown'] if args.show else [])
    print(f'{what} {" and ".join(done)}')


if __name__ == '__main__':
    run_cli(main)
