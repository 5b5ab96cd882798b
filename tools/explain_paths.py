"""Say which computation each part of a config's XCiT backbone runs for an
input, and why: its fast path or its straightforward computation.

    python tools/explain_paths.py CONFIG [--shape H [W]] [--device DEVICE]
        [--amp] [--train] [--cfg-options KEY=VALUE ...]

The backbone of the config's model runs once, eagerly, on one random image
of ``--shape`` (H alone: H x H; default: 800 1344 for detection, the COCO
recipes' padded test size, 512 512 for segmentation, the ADE20K crop) on
``--device`` (default: cuda where PyTorch sees a GPU, else cpu): in eval
mode without gradients, or with ``--train`` in training mode with
gradients, as a training step runs it; under autocast with ``--amp`` (fp16
on CUDA, bf16 on the CPU: mmengine's ``AmpOptimWrapper`` defaults). One row
per part with a fast path, its path and the reason
(``xcit_dense.models.explain_paths``), then what each reason means.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from xcit_dense import XCiT  # noqa: E402
from xcit_dense.cli import (  # noqa: E402
    add_cfg_options,
    add_shape_option,
    image_shape,
    load_config,
    run_cli,
    torch_device,
)
from xcit_dense.models.execution import compile_options  # noqa: E402
from xcit_dense.preflight import check_backbone, check_channels  # noqa: E402
from xcit_dense.toolkits import check_toolkit  # noqa: E402

#: the default input, (H, W), per toolkit
DEFAULT_SHAPES = dict(mmdet=(800, 1344), mmseg=(512, 512))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config', help='config file (or a model of the '
                        'model index)')
    add_shape_option(parser, help='the image size, H [W] (default: 800 1344 '
                     'for detection, 512 512 for segmentation)')
    parser.add_argument(
        '--device', type=torch_device, help='the device to run on (default: '
        'cuda where there is a GPU, else cpu)')
    parser.add_argument('--amp', action='store_true',
                        help='under autocast (fp16 on CUDA, bf16 on the CPU)')
    parser.add_argument('--train', action='store_true',
                        help='training mode with gradients (default: eval '
                        'mode without)')
    add_cfg_options(parser)
    args = parser.parse_args()
    args.shape = image_shape(parser, args)
    return args


def print_table(rows):
    """The rows of ``explain_paths``, then the reasons they give."""
    from xcit_dense.models.paths import REASONS
    header = ('part', 'path', 'reason')
    cells = [header] + [(r.name, r.path, r.reason) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(2)]
    for name, path, reason in cells:
        print(f'{name:<{widths[0]}}  {path:<{widths[1]}}  {reason}'.rstrip())
    print('\nReasons:')
    for reason in dict.fromkeys(r.reason for r in rows if r.reason):
        print(f'  {reason}: {REASONS[reason]}')


def main():
    args = parse_args()
    cfg = load_config(args.config, args.cfg_options)
    scope = check_toolkit(cfg.get('default_scope'))
    check_channels(cfg, check_backbone(cfg))
    shape = args.shape or DEFAULT_SHAPES[scope]

    import torch
    from mmengine.model import revert_sync_batchnorm

    from xcit_dense.inference import init_model
    from xcit_dense.models import explain_paths
    device = torch.device(args.device or (
        'cuda' if torch.cuda.is_available() else 'cpu'))
    # SyncBN runs as BatchNorm in one process, as mmengine's runner has it
    model = revert_sync_batchnorm(init_model(cfg, None, str(device)))
    autocast = None
    if args.amp:
        autocast = torch.float16 if device.type == 'cuda' else torch.bfloat16
    rows = explain_paths(model, shape, autocast=autocast,
                         training=args.train)
    backbone = type(model.backbone).__name__
    if not rows:
        print(f'The backbone ({backbone}) has no part with a fast path.')
        return
    precision = 'fp32' if autocast is None else \
        f'autocast {str(autocast).replace("torch.", "")}'
    print(f'{backbone} on {device}, one {shape[0]}x{shape[1]} image, '
          f'{"training" if args.train else "inference"}, {precision}:\n')
    print_table(rows)
    if isinstance(model.backbone, XCiT) and compile_options(
            model.backbone, device.type) is not None:
        print('\nThe config compiles the backbone on this device: under '
              'torch.compile the parts decide by the policy\'s compiled '
              'column; the rows above are the eager call\'s.')


if __name__ == '__main__':
    run_cli(main)
