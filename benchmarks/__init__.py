"""Measuring xcit-dense, outside the package and its wheel: the benchmark
(``python -m benchmarks.benchmark``, or ``tools/benchmark.py``) on its
harness (:mod:`benchmarks.harness`), the probes behind the policy's choices
(``python -m benchmarks.probes.NAME``), ``make gpu-report``'s steps
(``benchmarks/gpu/``, ``benchmarks/gpu_report.mk``), the results as data
(``benchmarks/results/``), the fingerprint of the code a row measures
(:mod:`benchmarks.fingerprint`) and the docs' tables generated from the
results (``python -m benchmarks.tables``)."""
