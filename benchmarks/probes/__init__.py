"""Probes: scripts that measured what a choice of the package rests on
(``python -m benchmarks.probes.NAME --help``)."""
