"""Convert an image-classification XCiT checkpoint into a clean backbone file.

Reads an official facebookresearch/xcit, timm (.pth/.bin/.safetensors) or
DINO checkpoint, drops the classification-only weights, renames to the
backbone's names, checks the result strictly against the XCiT preset it
matches (inferred from the shapes, or ``--arch``) and writes
``{'state_dict': ..., 'meta': ...}`` (or a ``.safetensors`` file).

Example::

    python tools/convert_checkpoint.py xcit_small_12_p16_224.pth \
        pretrained/xcit_small_12_p16.pth
"""
import argparse
import os
import os.path as osp
import sys
import time

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from xcit_dense import ARCH_SETTINGS, XCiT, __version__  # noqa: E402
from xcit_dense.checkpoint import (CheckpointError,  # noqa: E402
                                   convert_state_dict, extract_state_dict,
                                   infer_settings, match_state_dict,
                                   read_checkpoint)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('src', help='classification checkpoint to convert')
    parser.add_argument('dst', help='output (.pth, or .safetensors)')
    parser.add_argument(
        '--arch', choices=sorted(ARCH_SETTINGS),
        help='preset to check against (default: inferred from the shapes)')
    parser.add_argument(
        '--checkpoint-key',
        help="entry holding the weights, e.g. 'student' for DINO "
        "(default: 'state_dict', 'model' or 'teacher', whichever exists)")
    return parser.parse_args()


def step(msg):
    print(f'[{time.strftime("%H:%M:%S")}] {msg}', flush=True)


def main():
    args = parse_args()
    step(f'reading {args.src} ({osp.getsize(args.src) / 2**20:.1f} MiB)')
    raw = read_checkpoint(args.src)
    state_dict, fmt = extract_state_dict(raw, args.checkpoint_key)
    step(f'{fmt} checkpoint with {len(state_dict)} entries; converting')
    converted, dropped = convert_state_dict(state_dict)

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

    out = {}
    total = sum(v.numel() for v in to_load.values())
    done = 0
    for i, (k, v) in enumerate(sorted(to_load.items()), start=1):
        out[k] = v.detach().clone().contiguous()
        done += v.numel()
        bar = '#' * int(30 * done / max(total, 1))
        print(f'\r  copying [{bar:<30}] {i}/{len(to_load)} tensors, '
              f'{done / 1e6:.1f}M parameters', end='', flush=True)
    print()
    os.makedirs(osp.dirname(osp.abspath(args.dst)), exist_ok=True)
    meta = dict(source=osp.basename(args.src), source_format=fmt,
                arch=arch or '', xcit_dense_version=__version__)
    step(f'writing {args.dst}')
    if args.dst.endswith('.safetensors'):
        from safetensors.torch import save_file
        save_file(out, args.dst, metadata=meta)
    else:
        meta['dropped'] = sorted(dropped)
        torch.save({'state_dict': out, 'meta': meta}, args.dst)
    step(f'done: {osp.getsize(args.dst) / 2**20:.1f} MiB')


if __name__ == '__main__':
    try:
        main()
    except (CheckpointError, FileNotFoundError) as e:
        sys.exit(f'error: {e}')
