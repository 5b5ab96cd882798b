"""Generate the deterministic synthetic datasets of the embedded demos.

    python tools/make_synthetic_data.py coco data/synthetic_coco

Skips the work when the folder already holds the same data.
"""
import argparse
import os.path as osp
import sys
import time

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('kind', choices=['coco'])
    parser.add_argument('out_dir')
    parser.add_argument('--num-train', type=int, default=400)
    parser.add_argument('--num-val', type=int, default=100)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    from xcit_dense.datasets.synthetic_coco import make_synthetic_coco
    files = make_synthetic_coco(args.out_dir, num_train=args.num_train,
                                num_val=args.num_val, seed=args.seed)
    print(f'synthetic {args.kind} dataset in {args.out_dir} '
          f'({time.perf_counter() - start:.1f} s): ' +
          ', '.join(f'{k}: {v}' for k, v in files.items()))


if __name__ == '__main__':
    main()
