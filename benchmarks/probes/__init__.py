"""Probes: scripts that measured what a choice of the package rests on
(``python -m benchmarks.probes.NAME --help``)."""
import argparse

import torch


def parse_branch_args(description: str, arch: str, sizes: str, default,
                      argv=None):
    """The options of the probes that time one block's branches on the CPU
    (``--arch``, the ``sizes`` list, ``--batch``, ``--threads``,
    ``--repeat``, ``--rounds``), with the threads and seed set, and
    tools/benchmark.py's timing for them: the median of ``--repeat`` calls
    after two."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('--arch', default=arch)
    parser.add_argument(f'--{sizes}', type=int, nargs='+', default=default)
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--repeat', type=int, default=7)
    parser.add_argument('--rounds', type=int, default=2)
    args = parser.parse_args(argv)
    timing = argparse.Namespace(device='cpu', warmup=2, repeat=args.repeat,
                                batch=args.batch)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    return args, timing
