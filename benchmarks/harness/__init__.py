"""Benchmarks of backbones, whole detectors and segmentors: latency, memory
and multiply-adds by input size, each row measured in a fresh process or,
``--in-process``, in the tool's (``tools/benchmark.py`` is the command
line)."""
from .names import inferable, parse_model, trainable
from .outputs import write_outputs
from .runs import run_measurement

__all__ = ['inferable', 'parse_model', 'run_measurement', 'trainable',
           'write_outputs']
