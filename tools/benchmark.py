"""Benchmark dense backbones and detectors: latency, memory and FLOPs by size.

The benchmark lives in ``benchmarks/`` of the repository, outside the
package (its models, variants, outputs and options:
``benchmarks/benchmark.py``); this is its command line, as
``python -m benchmarks.benchmark`` from the repository's root is:

    python tools/benchmark.py --models xcit_small_12_p16@reference \\
        xcit_small_12_p16 --sizes 800x1344 --out-dir work_dirs/benchmark
"""
import os.path as osp
import sys

# benchmarks/ is the repository's, not the installed package's
sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from benchmarks.benchmark import (  # noqa: E402,F401
    build_parser,
    main,
    parse_model,
)
from xcit_dense.cli import run_cli  # noqa: E402

if __name__ == '__main__':
    run_cli(main)
