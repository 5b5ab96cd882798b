"""The machine's reference: the GFLOP/s of a square matmul in fp32 and bf16,
beside which every row's achieved rate is shown. Measured in the tool's own
process: no peak memory is read from it, and a process of its own cost a
start-up of torch and the package per run (on CUDA the tool's process then
holds a context on the GPU beside each row's; a row's peak is its own
process's allocations). On a CPU without native bf16 the reference is fp32
alone: there a 4096^2 bf16 product takes minutes (a 1024^2 one ran at 0.74
GFLOP/s on a 2-core AMD EPYC with AVX2 alone), and the tool refuses the rows
it would stand beside (:func:`.names.refuse_emulated_bf16`)."""
import statistics
import time
from typing import Dict, Optional, Tuple

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


def reference_dtypes(device: str) -> Tuple[str, ...]:
    """The reference's dtypes on ``device``: fp32 and bf16, fp32 alone on a
    CPU without native bf16
    (:func:`~xcit_dense.precision.cpu_has_native_bf16`)."""
    from xcit_dense import precision
    if device == 'cpu' and not precision.cpu_has_native_bf16():
        return ('float32', )
    return ('float32', 'bfloat16')


def matmul_rates(device: str, n: int, repeat: int,
                 threads: int) -> Dict[str, Optional[float]]:
    """``fp32_gflops_per_s`` and ``bf16_gflops_per_s`` on ``threads``
    threads (the rows' setting; the caller's own restored after); bf16's
    None where it is not measured (:func:`reference_dtypes`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rates = dict(fp32_gflops_per_s=None, bf16_gflops_per_s=None)
        for dtype in reference_dtypes(device):
            name = 'fp32' if dtype == 'float32' else 'bf16'
            rates[f'{name}_gflops_per_s'] = matmul_rate(device, n, repeat,
                                                        dtype)
        return rates
    finally:
        torch.set_num_threads(before)


def matmul_summary(matmul: Dict[str, Optional[float]]) -> str:
    """The reference's rates in words, for the log and the tables."""
    bf16 = matmul.get('bf16_gflops_per_s')
    return (f'fp32 {matmul["fp32_gflops_per_s"]:.0f} GFLOP/s, bf16 ' +
            ('not measured (no native bf16 on this CPU)' if bf16 is None
             else f'{bf16:.0f} GFLOP/s'))
