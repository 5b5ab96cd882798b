"""Peak bytes glibc's malloc has in use (``mallinfo2``; not RSS, so without
page-cache and allocator-return noise), sampled after every operator, during
one XCiT-S12/16 call at 800x1344 after a warm-up.

    PYTHONPATH=<tree> python docs/benchmark/redesign/alloc_peak.py \
        infer|train|cp|bf16

The tree on PYTHONPATH decides which code runs (the README compares a
worktree of the single-class backbone with the per-module layout).
"""
import ctypes
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        'arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks',
        'fsmblks', 'uordblks', 'fordblks', 'keepcost')]


LIBC = ctypes.CDLL('libc.so.6')
LIBC.mallinfo2.restype = MallInfo2


def in_use() -> int:
    info = LIBC.mallinfo2()
    return info.uordblks + info.hblkhd  # heap chunks + mmapped chunks


class PeakInUse(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.peak = in_use()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, in_use())
        return out


def main():
    from xcit_dense import XCiT
    mode = sys.argv[1] if len(sys.argv) > 1 else 'infer'
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = XCiT(arch='small_12_p16', with_cp=mode == 'cp',
                 autocast_dtype='bfloat16' if mode == 'bf16' else None)
    x = torch.randn(1, 3, 800, 1344)

    def step():
        if mode in ('infer', 'bf16'):
            with torch.no_grad():
                return model.eval()(x)
        model.train()
        sum(o.float().mean() for o in model(x)).backward()
        model.zero_grad(set_to_none=True)

    step()  # warm-up: caches, oneDNN primitives
    base = in_use()
    with PeakInUse() as peak:
        step()
    print(f'{mode}: peak in use above baseline '
          f'{(peak.peak - base) / 2**20:.1f} MiB (baseline '
          f'{base / 2**20:.1f} MiB)')


if __name__ == '__main__':
    main()
