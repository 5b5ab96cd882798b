"""Measuring xcit-dense, outside the package and its wheel: the results
as data (``benchmarks/results/``), the fingerprint of the code a row
measures (:mod:`benchmarks.fingerprint`) and the docs' tables generated
from the results (``python -m benchmarks.tables``)."""
