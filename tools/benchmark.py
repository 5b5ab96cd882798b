"""Benchmark dense backbones and detectors: latency, memory and FLOPs by size.

The benchmark lives in ``benchmarks/`` of the repository, outside the
package and its wheel (its models, variants, outputs and options:
``benchmarks/benchmark.py``); this is its command line, as
``python -m benchmarks.benchmark`` from the repository's root is:

    python tools/benchmark.py --models xcit_small_12_p16@reference \\
        xcit_small_12_p16 --sizes 800x1344 --out-dir work_dirs/benchmark
"""
import os.path as osp
import sys

# benchmarks/ is the repository's, next to this file's folder
sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

try:
    from benchmarks.benchmark import (  # noqa: F401
        build_parser,
        main,
        parse_model,
    )
except ModuleNotFoundError as error:
    if error.name != 'benchmarks':
        raise
    sys.exit('error: tools/benchmark.py runs in a clone of the xcit-dense '
             'repository, whose benchmarks/ folder it imports (the installed '
             'package does not include it): run it from the clone.')

from xcit_dense.cli import run_cli  # noqa: E402

if __name__ == '__main__':
    run_cli(main)
