"""Draw a detector's or segmentor's predictions on an image.

    python tools/demo.py IMAGE CONFIG CHECKPOINT --out result.jpg
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
from mmengine.config import DictAction  # noqa: E402

from xcit_dense.cli import load_config, run_cli  # noqa: E402
from xcit_dense.deploy import RUNTIMES, load_exported  # noqa: E402
from xcit_dense.errors import UserError  # noqa: E402
from xcit_dense.inference import init_model  # noqa: E402
from xcit_dense.preflight import check_checkpoint  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('image', help='image file')
    parser.add_argument('config', help='config file, or an .onnx file of a '
                        'segmentor or detector exported by '
                        'tools/export_onnx.py')
    parser.add_argument(
        'checkpoint', nargs='?', help='checkpoint file or http(s) URL (ours, '
        'or a published XCiT detector / segmentor); not with an .onnx file')
    # the names of mmdet's and mmseg's demo/image_demo.py too
    parser.add_argument('--out', '--out-file', dest='out', required=True,
                        help='output image file')
    parser.add_argument('--device', default='cpu', help='e.g. cpu, cuda:0')
    parser.add_argument('--score-thr', '--pred-score-thr', dest='score_thr',
                        type=float, default=0.3,
                        help='detection: smallest score drawn')
    parser.add_argument('--opacity', type=float, default=0.5,
                        help='segmentation: opacity of the label map')
    parser.add_argument('--runtime', choices=RUNTIMES,
                        default='onnxruntime',
                        help='the runtime of an .onnx file')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        default={}, help='override settings in the config')
    return parser.parse_args()


def main():
    args = parse_args()
    if not osp.isfile(args.image):
        raise UserError(f'Image not found: {args.image}')
    try:
        image = mmcv.imread(args.image, channel_order='rgb')
    except cv2.error:  # mmcv decodes with OpenCV, then converts to RGB
        image = None
    if image is None:
        raise UserError(f'Cannot read {args.image} as an image (a format '
                        'OpenCV decodes: PNG, JPEG, BMP, TIFF, WebP, ...).')
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    if args.config.endswith('.onnx'):
        return draw_exported(args, image)
    if args.checkpoint is None:
        raise UserError('CHECKPOINT is missing: a config needs the '
                        'checkpoint of its trained model (an .onnx file '
                        'needs none).')
    cfg = load_config(args.config, args.cfg_options)
    checkpoint = check_checkpoint(args.checkpoint, 'checkpoint')
    model = init_model(cfg, checkpoint, args.device)
    if cfg.default_scope == 'mmdet':
        from mmdet.apis import inference_detector
        draw(args, image, model.cfg.visualizer, model.dataset_meta,
             inference_detector(model, args.image), 'mmdet')
    else:
        from mmseg.apis import inference_model
        draw(args, image, model.cfg.visualizer, model.dataset_meta,
             inference_model(model, args.image), 'mmseg')


def draw_exported(args, image):
    """The predictions of an exported segmentor or detector."""
    if not osp.isfile(args.config):
        raise UserError(f'ONNX file not found: {args.config}')
    if args.checkpoint is not None:
        raise UserError(f'{args.config} holds its weights: give no '
                        f'CHECKPOINT (got {args.checkpoint}).')
    model = load_exported(args.config, args.runtime)
    draw(args, image, model.visualizer_cfg, model.dataset_meta,
         model.predict(args.image), model.scope, f' ({args.runtime})')


def draw(args, image, visualizer_cfg, dataset_meta, result, scope,
         how=''):
    """Draw ``result`` with the scope's visualizer as its tools do: boxes
    and masks scoring at least --score-thr, or the label map at
    --opacity."""
    from xcit_dense.toolkits import use_toolkit
    visualizers = use_toolkit(scope).VISUALIZERS
    visualizer = visualizers.build(visualizer_cfg)
    visualizer.dataset_meta = dataset_meta
    if scope == 'mmdet':
        visualizer.add_datasample(
            'result', image, data_sample=result, draw_gt=False,
            pred_score_thr=args.score_thr, out_file=args.out)
        n = int((result.pred_instances.scores >= args.score_thr).sum())
        print(f'{n} objects with score >= {args.score_thr}{how} drawn to '
              f'{args.out}')
    else:
        visualizer.alpha = args.opacity
        visualizer.add_datasample('result', image, data_sample=result,
                                  draw_gt=False, out_file=args.out)
        print(f'label map{how} drawn to {args.out}')


if __name__ == '__main__':
    run_cli(main)
