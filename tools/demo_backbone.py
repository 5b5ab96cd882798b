"""Run an XCiT backbone on a synthetic image and print its feature pyramid."""
import argparse
import os.path as osp
import sys
import time

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from xcit_dense import ARCH_SETTINGS, XCiT  # noqa: E402
from xcit_dense.cli import positive_int, run_cli  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--arch', default='small_12_p16',
                        choices=sorted(ARCH_SETTINGS))
    parser.add_argument('--size', type=positive_int, nargs=2,
                        default=(333, 517), metavar=('H', 'W'),
                        help='the image size (at least 17x17 for patch 16, '
                        '25x25 for patch 8; any with --out-sizes ceil)')
    parser.add_argument('--out-sizes', default='published',
                        choices=('published', 'ceil'),
                        help="the backbone's out_sizes: the published "
                        "backbone's level sizes, or ceil(H/s) x ceil(W/s)")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = XCiT(arch=args.arch, out_sizes=args.out_sizes).eval()
    H, W = args.size
    # A synthetic image: smooth gradients plus a bright square.
    y, x = torch.meshgrid(torch.linspace(-1, 1, H), torch.linspace(-1, 1, W),
                          indexing='ij')
    image = torch.stack([x, y, (x.abs() < 0.3) & (y.abs() < 0.3)]).float()
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f'XCiT {args.arch}: {n_params:.1f}M parameters, taps blocks '
          f'{list(model.out_indices)}; input 1x3x{H}x{W}, '
          f'{torch.get_num_threads()} threads')
    with torch.no_grad():
        start = time.perf_counter()
        outs = model(image[None])
        elapsed = time.perf_counter() - start
    for level, (out, stride) in enumerate(zip(outs, model.out_strides)):
        print(f'  level {level}: stride {stride:2d}  {tuple(out.shape)}')
    print(f'forward: {elapsed:.2f} s')


if __name__ == '__main__':
    run_cli(main)
