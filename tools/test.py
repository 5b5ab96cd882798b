"""Test (and evaluate) a detector or segmentor with an mmdet or mmseg config.

One script for both toolkits: the config's ``default_scope`` (``mmdet`` or
``mmseg``) decides the registries. Arguments are those of mmdet's and mmseg's
``tools/test.py``: for detection ``--out`` is a ``.pkl`` file of the raw
predictions; for segmentation it is a directory of predicted label maps
(PNG). ``--show-dir`` draws the predictions on the images into files,
``--show`` in a window (``--wait-time`` seconds each).

CHECKPOINT may also be an ``.onnx`` file of the whole segmentor or detector
written by tools/export_onnx.py (fp32 or INT8): it is evaluated the same
way, run by onnxruntime or OpenVINO (``--runtime``) on each test image.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from xcit_dense.cli import (  # noqa: E402
    add_run_arguments,
    check_display,
    check_output,
    config_from_args,
    run_cli,
    seconds,
)
from xcit_dense.deploy.runtimes import RUNTIMES  # noqa: E402
from xcit_dense.errors import UserError  # noqa: E402
from xcit_dense.preflight import check_fits, check_inputs, read_checked  # noqa: E402
from xcit_dense.runner import (  # noqa: E402
    add_required_hooks,
    build_runner,
    finish_distributed,
)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config', help='test config file path')
    parser.add_argument(
        'checkpoint', help='checkpoint file or http(s) URL (ours, or a '
        'published XCiT detector / segmentor)')
    parser.add_argument(
        '--out', help='detection: .pkl file of the predictions; '
        'segmentation: directory for the predicted label maps')
    parser.add_argument(
        '--show', action='store_true',
        help='show each image with its predictions drawn, in a window')
    parser.add_argument(
        '--show-dir', help='directory (inside the work dir) where images '
        'with the predictions drawn are saved')
    parser.add_argument(
        '--wait-time', type=seconds, default=2,
        help='seconds each image is shown with --show (0: until a key is '
        'pressed)')
    parser.add_argument(
        '--tta', action='store_true',
        help='test-time augmentation: the config\'s tta_model around its '
        'model, its tta_pipeline as the test pipeline (as mmdet\'s and '
        'mmseg\'s tools/test.py)')
    parser.add_argument(
        '--runtime', choices=RUNTIMES,
        help='the runtime of an .onnx CHECKPOINT (default: onnxruntime)')
    add_run_arguments(parser)
    return parser.parse_args()


def enable_visualization(cfg, args):
    """The config's visualization hook on, as mmdet's and mmseg's
    tools/test.py turn it on: drawing every image, in a window
    (``--show``) and/or into files (``--show-dir``)."""
    hook = cfg.default_hooks.get('visualization')
    if hook is None:
        raise UserError('--show and --show-dir need a visualization hook in '
                        'default_hooks of the config.')
    if args.show and args.show_dir and cfg.default_scope != 'mmdet':
        raise UserError(
            'Give --show or --show-dir for segmentation, not both: mmseg\'s '
            'visualization hook saves no image while it shows them.')
    hook['draw'] = True
    hook['interval'] = 1
    if args.show:
        check_display(instead='--show-dir DIR')
        hook['show'] = True
        hook['wait_time'] = args.wait_time
    if not args.show_dir:
        return
    if cfg.default_scope == 'mmdet':
        hook['test_out_dir'] = args.show_dir
    else:  # mmseg's hook saves through the visualizer; like mmdet's
        # test_out_dir, a relative show_dir lives in the work dir
        cfg.visualizer['save_dir'] = osp.join(cfg.work_dir, args.show_dir)


def use_tta(cfg):
    """The config's ``tta_model`` wrapping its model and its
    ``tta_pipeline`` as the test pipeline."""
    missing = [k for k in ('tta_model', 'tta_pipeline') if not cfg.get(k)]
    if missing:
        raise UserError(f'--tta needs {" and ".join(missing)} in the config '
                        '(the COCO recipes and mmseg\'s ADE20K bases define '
                        'them: a flip at several scales).')
    cfg.model = dict(cfg.tta_model, module=cfg.model)
    dataset = cfg.test_dataloader.dataset
    while 'dataset' in dataset:  # dataset wrappers
        dataset = dataset.dataset
    dataset.pipeline = cfg.tta_pipeline


def use_exported_model(cfg, args):
    """Test the exported file instead of the config's model: the file holds
    the network and the data preprocessor, the config gives the dataset,
    the metrics and the tools' settings."""
    from xcit_dense.deploy import RuntimeModel  # noqa: F401 (registers it)
    if not osp.isfile(args.checkpoint):
        raise UserError(f'ONNX file not found: {args.checkpoint}')
    if str(cfg.model.get('type', '')).endswith('TTAModel'):
        raise UserError('Test-time augmentation runs the PyTorch model; '
                        'give a checkpoint, not an .onnx file, with a TTA '
                        'config.')
    cfg.model = dict(type='xcit_dense.RuntimeModel',
                     file=osp.abspath(args.checkpoint),
                     runtime=args.runtime or 'onnxruntime',
                     scope=cfg.default_scope)


def test_only(cfg, checkpoint):
    """The config set to test ``checkpoint`` (None: an exported file): the
    trained weights are loaded whole and strictly by the runner, after its
    hooks' before_run (EMAHook's average model exists then), as mmdet's
    and mmseg's test.py load them; no pretrained import needed. A test
    builds nothing of training: mmseg's visualization hook reads
    runner.iter, which would build the training loop and its dataset
    (missing where only the test data is there)."""
    cfg.load_from, cfg.resume = checkpoint, False
    cfg.train_dataloader = cfg.train_cfg = cfg.optim_wrapper = None
    cfg.param_scheduler = None
    tta = str(cfg.model.get('type', '')).endswith('TTAModel')
    inner = cfg.model.module if tta else cfg.model
    if inner.get('backbone', {}).get('init_cfg'):
        inner.backbone.init_cfg = None


def save_predictions(cfg, out):
    """``--out``: detection's predictions into a .pkl file, segmentation's
    label maps (PNG) into a folder."""
    if cfg.default_scope == 'mmdet':
        if not out.endswith(('.pkl', '.pickle')):
            raise UserError('--out for detection must be a .pkl file, '
                            f'got {out}')
        check_output(out, '--out')
        evaluators = cfg.test_evaluator if isinstance(
            cfg.test_evaluator, list) else [cfg.test_evaluator]
        cfg.test_evaluator = evaluators + [
            dict(type='DumpDetResults', out_file_path=out)]
    else:
        check_output(out, '--out', folder=True)
        cfg.test_evaluator['output_dir'] = out
        cfg.test_evaluator['keep_results'] = True


def main():
    args = parse_args()
    cfg = config_from_args(args)
    if args.tta:
        use_tta(cfg)
    exported = args.checkpoint.endswith('.onnx')
    if exported:
        use_exported_model(cfg, args)
    elif args.runtime is not None:
        raise UserError(f'--runtime chooses the runtime of an .onnx file; '
                        f'{args.checkpoint} is run by PyTorch.')
    # a URL is downloaded once into torch's hub cache, as mmdet does
    checkpoint = None
    if not exported:
        checkpoint, contents = read_checked(args.checkpoint,
                                            'checkpoint to test')
    check_inputs(cfg, training=False)
    if not exported:  # before the runner writes its work dir
        check_fits(cfg, contents, allow_new_classes=False)
    test_only(cfg, checkpoint)
    if args.show or args.show_dir:
        enable_visualization(cfg, args)
    if args.out:
        save_predictions(cfg, args.out)
    if not exported:
        # A test-time-augmentation model holds the trained one as `module`;
        # mmengine loads into that (load_state_dict unwraps a BaseTTAModel).
        # xcit_dense.CheckpointImportHook converts a published (mmdet 2 /
        # mmseg 0) checkpoint and checks every weight, the class-dependent
        # layers too.
        add_required_hooks(
            cfg, CheckpointImportHook=dict(allow_new_classes=False))
    runner = build_runner(cfg)
    runner.test()
    finish_distributed()


if __name__ == '__main__':
    run_cli(main)
