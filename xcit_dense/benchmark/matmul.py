"""The machine's reference: the GFLOP/s of a square matmul in fp32 and bf16,
beside which every row's achieved rate is shown. Measured in the tool's own
process: no peak memory is read from it, and a process of its own cost a
start-up of torch and the package per run (on CUDA the tool's process then
holds a context on the GPU beside each row's; a row's peak is its own
process's allocations)."""
import statistics
import time
from typing import Dict

import torch


def synchronize(device: str) -> None:
    """Wait for ``device``'s queued work (CUDA's; the CPU's is done)."""
    if device == 'cuda':
        torch.cuda.synchronize()


def matmul_rate(device: str, n: int, repeat: int, dtype_name: str) -> float:
    """GFLOP/s of an ``n x n`` matmul in ``dtype_name`` on ``device``."""
    dtype = getattr(torch, dtype_name)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    times = []
    for i in range(2 + max(repeat, 5)):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times) / 1e9


def matmul_rates(device: str, n: int, repeat: int,
                 threads: int) -> Dict[str, float]:
    """``fp32_gflops_per_s`` and ``bf16_gflops_per_s`` on ``threads``
    threads (the rows' setting; the caller's own restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return {f'{name}_gflops_per_s': matmul_rate(device, n, repeat, dtype)
                for name, dtype in (('fp32', 'float32'),
                                    ('bf16', 'bfloat16'))}
    finally:
        torch.set_num_threads(before)
