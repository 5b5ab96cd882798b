"""``make gpu-report``'s probes and its table
(``benchmarks/gpu_report.mk``)."""
