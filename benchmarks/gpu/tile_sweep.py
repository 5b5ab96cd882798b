"""The Triton kernels' tile sizes and warps, measured on a GPU.

XCA's and LPI's kernels (``xcit_dense/models/ops/xca_kernels.py``,
``lpi_kernels.py``) take their tile sizes and warps per program from module
constants chosen on the CPU, so that they compile for sm_80 and sm_90
without spilling registers (``tools/compile_kernels.py``); how fast each
choice runs only a GPU says. For every dtype (fp32, bf16, fp16) this times
one forward and backward of each part at XCiT-S12/16's shapes for a
800x1344 image (batch 2: 50 x 84 tokens of 384 channels, 8 heads) under
each candidate, every other constant at its default:

* XCA: ``TILES`` (tokens per tile and warps of ``_attend`` and
  ``_token_gradients``, for the dtype's product precision), then
  ``BLOCK_N`` / ``TOKENS_PER_PROGRAM`` of the token sums;
* LPI: ``TILE_WARPS`` with each ``BLOCK_N`` x ``BLOCK_C`` tile.

Each row: the CUDA-event median in ms (after warm-up; the first call
compiles), the largest difference of the outputs and gradients to the
default choice's, relative to its largest value, or the error (a choice
that does not compile or run records it, the others go on). Rows are
written as they come to ``DIR/tile_sweep.jsonl``; the default's row has
``"default": true``. Run on a CUDA machine::

    python -m benchmarks.gpu.tile_sweep --out DIR

(On the CPU, under ``TRITON_INTERPRET=1``, the same runs interpreted at a
tiny size, ``--size 2x3 --channels 32 --heads 2``: the tests check the
plumbing; the times mean nothing there.)
"""
import argparse
import json
import os
import os.path as osp
import time
from contextlib import contextmanager
from itertools import islice

import torch

from benchmarks.gpu import launch_probe
from xcit_dense.models.ops import lpi_kernels, xca_kernels

DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16,
          'float16': torch.float16}
#: candidates, each a dict of module constants; the defaults are the
#: modules' own (measured first)
XCA_TILES = ((32, 4), (32, 8), (64, 4), (64, 8), (128, 8))
XCA_TOKEN_SUMS = ((32, 512), (64, 1024), (128, 1024))
LPI_WARPS = (4, 8)
LPI_BLOCKS = ((32, 64), (16, 64), (64, 64), (32, 32), (32, 128))


def xca_candidates(dtype):
    precision = xca_kernels.dot_precision(dtype)
    tiles = dict(xca_kernels.TILES)
    yield 'TILES', dict(TILES=tiles)
    for tile in XCA_TILES:
        if tile != tiles[precision]:
            yield 'TILES', dict(TILES=dict(tiles, **{precision: tile}))
    for block, per_program in XCA_TOKEN_SUMS:
        if (block, per_program) != (xca_kernels.BLOCK_N,
                                    xca_kernels.TOKENS_PER_PROGRAM):
            yield 'token sums', dict(BLOCK_N=block,
                                     TOKENS_PER_PROGRAM=per_program)


def lpi_candidates(dtype):
    default = (lpi_kernels.TILE_WARPS, lpi_kernels.BLOCK_N,
               lpi_kernels.BLOCK_C)
    yield 'tiles', dict(TILE_WARPS=default[0], BLOCK_N=default[1],
                        BLOCK_C=default[2])
    for warps in LPI_WARPS:
        for block_n, block_c in LPI_BLOCKS:
            if (warps, block_n, block_c) != default:
                yield 'tiles', dict(TILE_WARPS=warps, BLOCK_N=block_n,
                                    BLOCK_C=block_c)


@contextmanager
def constants(module, values):
    """``module``'s constants set to ``values`` inside the block."""
    saved = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def xca_step(B, H, W, C, heads, dtype, device):
    g = torch.Generator(device='cpu').manual_seed(0)
    qkv = torch.randn(B, H * W, 3 * C, generator=g).to(device, dtype)
    temperature = (torch.rand(heads, 1, 1, generator=g) + 0.5).to(device)
    grad = torch.randn(B, H * W, C, generator=g).to(device, dtype)

    def step():
        q = qkv.detach().requires_grad_()
        t = temperature.detach().requires_grad_()
        out = xca_kernels.attention(q, t, heads)
        return (out, *torch.autograd.grad(out, (q, t), grad))
    return step


def lpi_step(B, H, W, C, heads, dtype, device):
    g = torch.Generator(device='cpu').manual_seed(0)
    y = (torch.randn(B, H * W, C, generator=g) + 1).to(device, dtype)
    residual = torch.randn(B, H * W, C, generator=g).to(device)
    gamma = (torch.rand(C, generator=g) + 0.5).to(device)
    grad = torch.randn(B, H * W, C, generator=g).to(device)
    conv1, conv2 = (torch.nn.Conv2d(C, C, 3, padding=1, groups=C)
                    for _ in range(2))
    bn = torch.nn.BatchNorm2d(C)
    layers = [m.to(device).train() for m in (conv1, bn, conv2)]

    def step():
        inputs = [t.detach().requires_grad_() for t in (y, residual, gamma)]
        params = [p for m in layers for p in m.parameters()]
        out = lpi_kernels.local_interaction(inputs[0], H, W, *layers,
                                            gamma=inputs[2],
                                            residual=inputs[1])
        return (out, *torch.autograd.grad(out, inputs + params, grad))
    return step


PARTS = {'xca': (xca_kernels, xca_candidates, xca_step),
         'lpi': (lpi_kernels, lpi_candidates, lpi_step)}


def outputs_and_ms(step, device, warmup=3, repeat=20):
    """``step``'s outputs and its time in ms: on CUDA, after a first call
    (it compiles), CUDA events' median (``launch_probe.py``'s); under the
    interpreter the wall time of the call after the warm-up, whose outputs
    they are (the plumbing only: each interpreted call takes seconds)."""
    if device.type == 'cuda':
        got = step()
        return got, launch_probe.median_ms(step, warmup, repeat)
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    got = step()
    return got, 1e3 * (time.perf_counter() - start)


def largest_difference(got, ref):
    return max(((g.float() - r.float()).abs().max() /
                r.float().abs().max().clamp_min(1e-12)).item()
               for g, r in zip(got, ref))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', required=True)
    parser.add_argument('--parts', nargs='+', choices=list(PARTS),
                        default=list(PARTS))
    parser.add_argument('--dtypes', nargs='+', choices=list(DTYPES),
                        default=list(DTYPES))
    parser.add_argument('--size', default='50x84',
                        help='the token grid (800x1344 at stride 16)')
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--channels', type=int, default=384)
    parser.add_argument('--heads', type=int, default=8)
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--repeat', type=int, default=20)
    parser.add_argument('--limit', type=int, default=None,
                        help='candidates per part and dtype, the default '
                        'first (all: none given)')
    args = parser.parse_args(argv)
    interpreted = os.environ.get('TRITON_INTERPRET') == '1'
    if not torch.cuda.is_available() and not interpreted:
        raise SystemExit('tile_sweep.py measures the kernels on a CUDA '
                         'device; none is visible (on the CPU only with '
                         'TRITON_INTERPRET=1, whose times mean nothing).')
    device = torch.device('cpu' if interpreted else 'cuda')
    H, W = map(int, args.size.split('x'))
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32: IEEE products
    os.makedirs(args.out, exist_ok=True)
    path = osp.join(args.out, 'tile_sweep.jsonl')
    with open(path, 'w') as f:
        for part in args.parts:
            module, candidates, make_step = PARTS[part]
            for dtype_name in args.dtypes:
                dtype = DTYPES[dtype_name]
                step = make_step(args.batch, H, W, args.channels, args.heads,
                                 dtype, device)
                reference = None
                for i, (what, values) in enumerate(
                        islice(candidates(dtype), args.limit)):
                    row = dict(part=part, dtype=dtype_name, what=what,
                               constants=values, default=i == 0,
                               size=args.size, batch=args.batch,
                               channels=args.channels)
                    try:
                        with constants(module, values):
                            got, row['ms'] = outputs_and_ms(
                                step, device, args.warmup, args.repeat)
                        if i == 0:
                            reference = got
                        if reference is not None:
                            row['max_rel_diff_vs_default'] = \
                                largest_difference(got, reference)
                    except Exception as error:  # recorded, the sweep goes on
                        row['error'] = f'{type(error).__name__}: ' \
                            f'{str(error)[:300]}'
                    f.write(json.dumps(row) + '\n')
                    f.flush()
                    print(json.dumps(row), flush=True)


if __name__ == '__main__':
    main()
