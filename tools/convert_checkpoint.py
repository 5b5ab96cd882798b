"""Convert an XCiT checkpoint: a classification model into a clean backbone
file, or a published detector / segmentor into an mmdet 3 / mmseg 1 one.

Classification: reads an official facebookresearch/xcit, timm
(.pth/.bin/.safetensors) or DINO checkpoint, drops the classification-only
weights, renames to the backbone's names, checks the result strictly against
the XCiT preset it matches (inferred from the shapes, or ``--arch``) and
writes ``{'state_dict': ..., 'meta': ...}`` (or a ``.safetensors`` file).

Published detectors and segmentors (mmdet 2.11 / mmseg 0.11 layout): renames
what changed, moves the class names and palette into ``meta['dataset_meta']``,
drops the optimizer state, checks every weight against the model of
``--config`` (default: the model index's config for the published file name)
and writes ``{'meta': ..., 'state_dict': ...}``. SRC may be an http(s) URL.

Examples::

    python tools/convert_checkpoint.py xcit_small_12_p16_384_dist.pth \
        pretrained/xcit_small_12_p16_384_dist.pth
    URL=https://dl.fbaipublicfiles.com/xcit/coco/maskrcnn_xcit_small_12_p16.pth
    python tools/convert_checkpoint.py $URL \
        checkpoints/mask_rcnn_xcit_s12_p16_3x_coco.pth
"""
import argparse
import os.path as osp
import sys
import time

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from xcit_dense import ARCH_SETTINGS, XCiT, __version__  # noqa: E402
from xcit_dense.atomic_files import (  # noqa: E402
    move_into_place,
    unverified_file,
)
from xcit_dense.checkpoint import (  # noqa: E402
    convert_state_dict,
    extract_state_dict,
    infer_settings,
    local_checkpoint,
    match_state_dict,
    read_checkpoint,
)
from xcit_dense.checkpoint.published import (  # noqa: E402
    check_model_weights,
    convert_published,
    is_published,
)
from xcit_dense.cli import check_output, load_config, run_cli  # noqa: E402
from xcit_dense.errors import UserError  # noqa: E402
from xcit_dense.model_index import model_for_weights  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument(
        'src', help='checkpoint to convert (file or http(s) URL)')
    parser.add_argument('dst', help='output (.pth, or .safetensors)')
    parser.add_argument(
        '--arch', choices=sorted(ARCH_SETTINGS),
        help='preset to check against (default: inferred from the shapes)')
    parser.add_argument(
        '--checkpoint-key',
        help="entry holding the weights, e.g. 'student' for DINO "
        "(default: 'state_dict', 'model' or 'teacher', whichever exists)")
    parser.add_argument(
        '--config',
        help='published detectors / segmentors: the config (or model-index '
        'name) whose model every weight is checked against (default: the '
        "model index's config for SRC's file name)")
    return parser.parse_args()


def step(msg):
    print(f'[{time.strftime("%H:%M:%S")}] {msg}', flush=True)


def build_model(config: str):
    """The detector / segmentor of ``config``, randomly initialised."""
    from xcit_dense.toolkits import use_toolkit
    cfg = load_config(config)
    if cfg.model.get('backbone', {}).get('init_cfg'):
        cfg.model.backbone.init_cfg = None
    return use_toolkit(cfg.get('default_scope', 'mmdet')).MODELS.build(
        cfg.model)


def convert_whole_model(args, raw):
    config = args.config
    if config is None:
        entry = model_for_weights(args.src)
        if entry is None:
            raise UserError(
                f'{args.src} is a published XCiT detector / segmentor, but '
                'its file name is not in the model index; pass the config '
                'it was trained with, e.g. --config '
                'configs/coco/mask_rcnn_xcit_s12_p16_3x_coco.py.')
        config = entry['Config']
    converted, changes = convert_published(raw)
    for change in changes:
        print(f'  {change}')
    step(f'checking every weight against the model of {config}')
    weights, _ = check_model_weights(converted['state_dict'],
                                     build_model(config).state_dict())
    meta = dict(converted['meta'], source=osp.basename(args.src),
                config=osp.basename(config), xcit_dense_version=__version__)
    step(f'writing {args.dst}')
    with unverified_file(args.dst, '.pth') as partial:
        torch.save(dict(meta=meta, state_dict=weights), partial)
        move_into_place(partial, args.dst)
    step(f'done: {len(weights)} tensors, '
         f'{osp.getsize(args.dst) / 2**20:.1f} MiB')


def checked_source(args):
    """The local path of SRC (a URL downloaded once), after checking that
    DST is a file this tool can write and not SRC itself."""
    if not args.dst.endswith(('.pth', '.safetensors')):
        raise UserError(f'DST names the file to write, ending in .pth (an '
                        f'mmengine checkpoint) or .safetensors; got '
                        f'{args.dst}.')
    check_output(args.dst, 'DST')
    src = local_checkpoint(args.src)
    if not osp.isfile(src):
        raise UserError(f'Checkpoint file not found: {args.src}')
    if osp.exists(args.dst) and osp.samefile(src, args.dst):
        raise UserError(f'DST is SRC ({args.dst}): the converted weights '
                        'go to a file of their own.')
    return src


def check_whole_model_options(args):
    """A published detector / segmentor takes --config, not the options of
    a classification checkpoint, and is written as .pth."""
    given = [f'--{name.replace("_", "-")}'
             for name in ('arch', 'checkpoint_key')
             if getattr(args, name) is not None]
    if given:
        raise UserError(
            f'{" and ".join(given)} '
            f'{"choose" if len(given) > 1 else "chooses"} what a '
            'classification / '
            f'backbone checkpoint is checked against; {args.src} is a '
            'published XCiT detector / segmentor, checked against the '
            'whole model of its config (--config, or the model '
            "index's for its file name). Leave out "
            f'{" and ".join(given)}.')
    if args.dst.endswith('.safetensors'):
        raise UserError(
            f'{args.src} is a whole detector / segmentor, which is '
            'written as .pth (an mmengine checkpoint, with its class '
            'names and palette); DST ends in .safetensors.')


def checked_backbone_weights(args, converted, dropped):
    """The preset (``--arch``, or the one the shapes give; None: the
    shapes' settings) and the weights of ``converted`` that fit its
    backbone, strictly checked; what else is dropped goes to
    ``dropped``."""
    settings = infer_settings(converted)
    arch = args.arch or next(
        (name for name, preset in ARCH_SETTINGS.items()
         if all(preset[k] == v for k, v in settings.items())), None)
    if arch is not None:
        print(f'  arch: {arch} ({settings})')
        model = XCiT(arch=arch, out_indices=None)
    else:
        print(f'  no preset matches {settings}; checking against an XCiT '
              'with these settings')
        model = XCiT(arch=None, **settings)
    step('checking every backbone weight against the model')
    to_load, unused, fresh = match_state_dict(model, converted)
    dropped.update(unused)
    print(f'  {len(to_load)} backbone weights kept; {len(dropped)} entries '
          f'dropped; {len(fresh)} pyramid parameters not in the source '
          '(initialised when training starts)')
    for key, why in sorted(dropped.items()):
        print(f'    dropped {key}: {why}')
    return arch, to_load


def copied(to_load):
    """Contiguous copies of the weights, with a progress bar: redrawn in
    place on a terminal; in a log (a file, a pipe), the last frame only."""
    out = {}
    total = sum(v.numel() for v in to_load.values())
    done = 0
    terminal = sys.stdout.isatty()
    start, end = ('\r', '') if terminal else ('', '\n')
    for i, (k, v) in enumerate(sorted(to_load.items()), start=1):
        out[k] = v.detach().clone().contiguous()
        done += v.numel()
        if terminal or i == len(to_load):
            bar = '#' * int(30 * done / max(total, 1))
            print(f'{start}  copying [{bar:<30}] {i}/{len(to_load)} '
                  f'tensors, {done / 1e6:.1f}M parameters', end=end,
                  flush=True)
    if terminal:
        print()
    return out


def convert_backbone(args, raw):
    state_dict, fmt = extract_state_dict(raw, args.checkpoint_key)
    step(f'{fmt} checkpoint with {len(state_dict)} entries; converting')
    converted, dropped = convert_state_dict(state_dict)
    arch, to_load = checked_backbone_weights(args, converted, dropped)
    out = copied(to_load)
    meta = dict(source=osp.basename(args.src), source_format=fmt,
                arch=arch or '', xcit_dense_version=__version__)
    step(f'writing {args.dst}')
    with unverified_file(args.dst, osp.splitext(args.dst)[1]) as partial:
        if args.dst.endswith('.safetensors'):
            from safetensors.torch import save_file
            save_file(out, partial, metadata=meta)
        else:
            meta['dropped'] = sorted(dropped)
            torch.save({'state_dict': out, 'meta': meta}, partial)
        move_into_place(partial, args.dst)
    step(f'done: {osp.getsize(args.dst) / 2**20:.1f} MiB')


def main():
    args = parse_args()
    src = checked_source(args)
    step(f'reading {args.src} ({osp.getsize(src) / 2**20:.1f} MiB)')
    raw = read_checkpoint(src)
    if is_published(raw):
        check_whole_model_options(args)
        step('a published XCiT detector / segmentor (mmdet 2 / mmseg 0 '
             'layout); converting')
        return convert_whole_model(args, raw)
    if args.config is not None:
        raise UserError(
            f'--config is for published detectors and segmentors; '
            f'{args.src} is a classification / backbone checkpoint, which '
            'is checked against the XCiT preset its shapes give (or '
            '--arch), not against a config. Leave out --config.')
    convert_backbone(args, raw)


if __name__ == '__main__':
    run_cli(main)
