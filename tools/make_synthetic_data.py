"""Generate the deterministic synthetic datasets of the embedded demos.

    python tools/make_synthetic_data.py coco data/synthetic_coco
    python tools/make_synthetic_data.py ade20k data/synthetic_ade20k

Skips the work when the folder already holds the same data; otherwise the
folder ends holding exactly the new dataset (what an earlier generation
wrote there is removed first; other files stay). A folder holding the
other kind's data is refused.
"""
import argparse
import os.path as osp
import sys
import time

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from xcit_dense.cli import check_output, positive_int, run_cli  # noqa: E402
from xcit_dense.errors import UserError  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('kind', choices=['coco', 'ade20k'])
    parser.add_argument('out_dir')
    parser.add_argument('--num-train', type=positive_int,
                        help='default: 400 (coco), 300 (ade20k)')
    parser.add_argument('--num-val', type=positive_int,
                        help='default: 100 (coco), 60 (ade20k)')
    parser.add_argument('--seed', type=int, default=0,
                        help='a whole number >= 0 (default 0)')
    args = parser.parse_args()
    if args.seed < 0:
        parser.error(f'argument --seed: expected a whole number >= 0, got '
                     f'{args.seed}')
    if not args.out_dir:
        raise UserError('out_dir is empty: name the folder to write the '
                        'dataset in, e.g. data/synthetic_coco.')
    check_output(args.out_dir, 'out_dir', folder=True)
    start = time.perf_counter()
    sizes = {k: v for k, v in (('num_train', args.num_train),
                               ('num_val', args.num_val)) if v is not None}
    if args.kind == 'coco':
        from xcit_dense.datasets.synthetic_coco import make_synthetic_coco
        files = make_synthetic_coco(args.out_dir, seed=args.seed, **sizes)
    else:
        from xcit_dense.datasets.synthetic_ade20k import make_synthetic_ade20k
        files = make_synthetic_ade20k(args.out_dir, seed=args.seed, **sizes)
    print(f'synthetic {args.kind} dataset in {args.out_dir} '
          f'({time.perf_counter() - start:.1f} s): ' +
          ', '.join(f'{k}: {v}' for k, v in files.items()))


if __name__ == '__main__':
    run_cli(main)
