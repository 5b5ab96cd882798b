"""How many Triton kernel variants multi-scale training asks a GPU to
compile: does every new image size compile the kernels anew?

Triton compiles a kernel once per variant: its compile-time constants (the
package's tile sizes, which depend on the channels only) and, for each
integer argument, whether it is 1 or a multiple of 16. The token grid's
height, width and count change with the image size, so a new size can ask
for a new variant, but only as often as these classes change. This runs an
XCiT preset's training step and inference on the CPU as a GPU would run
them (the kernels selected as on CUDA, each launch recorded instead of
compiled or run: ``tools/compile_kernels.py``'s ``recording``) for batches
of two images of COCO's commonest sizes resized as the 3x recipes'
multi-scale branch resizes them (shorter side one of 480, 512, ..., 800,
longer at most 1333, aspect kept), each batch padded to a multiple of 32
as the data preprocessor pads it; it prints the variants asked for so far
after each batch, then by kernel::

    python -m benchmarks.probes.kernel_variants [--preset nano_12_p16]
        [--batches 30] [--dtype float16] [--seed 0]

No GPU needed; each batch takes the CPU the preset's convolutions and
linear layers at that size (XCiT-N12: about 30 s a batch on a 2-core
EPYC).
"""
import argparse
import os.path as osp
import random
import runpy
import time
from collections import Counter
from types import SimpleNamespace

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
#: tools/compile_kernels.py's recording of launches and its model's run
compile_kernels = SimpleNamespace(**runpy.run_path(
    osp.join(REPO, 'tools', 'compile_kernels.py'),
    run_name='compile_kernels'))

#: the commonest COCO image sizes (height, width)
COCO_SIZES = ((480, 640), (640, 480), (427, 640), (640, 427), (375, 500),
              (500, 375), (424, 640), (612, 612), (360, 640))
#: the 3x recipes' multi-scale resize (configs/coco/_base_/
#: mask_rcnn_xcit_3x_coco.py): (longer side at most, shorter side)
SCALES = [(1333, s) for s in range(480, 801, 32)]


def resized(h: int, w: int, rng: random.Random):
    """(h, w) resized to a random scale of :data:`SCALES`, aspect kept (as
    mmcv's ``rescale_size``)."""
    longest, shortest = rng.choice(SCALES)
    factor = min(longest / max(h, w), shortest / min(h, w))
    return int(h * factor + 0.5), int(w * factor + 0.5)


def padded_batches(count: int, seed: int):
    """``count`` batches of two images: the padded (H, W) of each."""
    rng = random.Random(seed)
    for _ in range(count):
        images = [resized(*rng.choice(COCO_SIZES), rng) for _ in range(2)]
        yield tuple(-(-max(size[i] for size in images) // 32) * 32
                    for i in (0, 1))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--preset', default='nano_12_p16')
    parser.add_argument('--batches', type=int, default=30)
    parser.add_argument('--dtype', default='float16',
                        choices=compile_kernels.DTYPES)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    launches = {}
    sizes = set()
    start = time.perf_counter()
    print(f'XCiT {args.preset}, {args.dtype}, training step and inference, '
          f'batches of 2: batch, padded size, variants so far (new)')
    for i, size in enumerate(padded_batches(args.batches, args.seed), 1):
        before = len(launches)
        with compile_kernels.recording(launches, args.dtype):
            compile_kernels.run_model(args.preset, size, 2, args.dtype)
        sizes.add(size)
        print(f'{i:3d}  {size[0]}x{size[1]}  {len(launches)} '
              f'(+{len(launches) - before})  '
              f'{time.perf_counter() - start:.0f} s', flush=True)
    print(f'\n{len(launches)} variants for {len(sizes)} distinct sizes; by '
          f'kernel:')
    for kernel, n in sorted(Counter(k[1] for k in launches).items()):
        print(f'  {kernel}: {n}')


if __name__ == '__main__':
    main()
