"""Which fast path pays on a GPU: every part of XCiT-S12/16 switched on and
off alone, eager and compiled, fp32 and fp16 autocast, inference and a
training step, in one process (CUDA events, medians).

The measurements behind the CUDA column of the fast-path policy
(``xcit_dense/models/policy.py``). Run on a CUDA machine::

    python docs/benchmark/gpu/policy_probe.py --out probe.json [--compile]

Prints one JSON line per measurement and writes them all to ``--out``.
"""
import argparse
import json
import os.path as osp
import statistics
import sys
import time

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.dirname(
    osp.abspath(__file__))))))

from xcit_dense import XCiT  # noqa: E402
from xcit_dense.models.block import XCABlock  # noqa: E402
from xcit_dense.models.lpi import LPI  # noqa: E402
from xcit_dense.models.mlp import Mlp  # noqa: E402
from xcit_dense.models.positional_encoding import CachedFourierEncoding  # noqa: E402
from xcit_dense.models.pyramid import TransposedConvUpsampler  # noqa: E402
from xcit_dense.models.stem import ConvPatchEmbed  # noqa: E402
from xcit_dense.models.xca import XCA  # noqa: E402

PARTS = dict(stem=ConvPatchEmbed, pos=CachedFourierEncoding, xca=XCA,
             lpi=LPI, mlp=Mlp, block=XCABlock,
             pyramid=TransposedConvUpsampler)


def set_parts(model, on):
    for m in model.modules():
        for name, cls in PARTS.items():
            if type(m) is cls:
                m.use_fast_path = name in on


def timed(step, warmup, repeat):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def scenario_step(model, mode, amp, x):
    ctx = (lambda: torch.autocast('cuda', dtype=torch.float16)) if amp \
        else (lambda: torch.autocast('cuda', enabled=False))
    if mode == 'infer':
        def step():
            with torch.no_grad(), ctx():
                return model(x)
    else:
        def step():
            model.zero_grad(set_to_none=True)
            with ctx():
                outs = model(x)
            sum(o.float().sum() for o in outs).backward()
    return step


SCENARIOS = [  # mode, amp, batch, (h, w)
    ('infer', False, 1, (800, 1344)),
    ('infer', True, 1, (800, 1344)),
    ('train', True, 2, (800, 1344)),
    ('train', True, 2, (512, 512)),
    ('train', False, 2, (800, 1344)),
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--out', required=True)
    p.add_argument('--arch', default='small_12_p16')
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--repeat', type=int, default=10)
    p.add_argument('--compile', action='store_true')
    p.add_argument('--budget-s', type=float, default=400)
    args = p.parse_args()
    t0 = time.time()
    rows = []

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, 'w') as f:
            json.dump(rows, f, indent=1)

    torch.manual_seed(0)
    model = XCiT(arch=args.arch).cuda()
    names = list(PARTS)
    configs = [('reference', set()), ('all', set(names))]
    configs += [(f'all-{n}', set(names) - {n}) for n in names]
    configs += [(f'ref+{n}', {n}) for n in names]
    for mode, amp, batch, (h, w) in SCENARIOS:
        model.train(mode == 'train')
        x = torch.randn(batch, 3, h, w, device='cuda')
        step = scenario_step(model, mode, amp, x)
        for label, on in configs:
            set_parts(model, on)
            torch.cuda.reset_peak_memory_stats()
            ms = timed(step, args.warmup, args.repeat)
            emit(dict(config=label, mode=mode, amp=amp, batch=batch, h=h,
                      w=w, ms=ms, compiled=False,
                      peak_gib=torch.cuda.max_memory_allocated() / 2**30))
    if not args.compile:
        return
    # compiled: the backbone's own compile_cfg, fast paths on and off
    for mode, amp, batch, (h, w) in SCENARIOS[:3]:
        for label, on, cfg in [
                ('all', set(names), dict(dynamic=True)),
                ('reference', set(), dict(dynamic=True)),
                ('xca-off', set(names) - {'xca', 'block'},
                 dict(dynamic=True))]:
            if time.time() - t0 > args.budget_s:
                emit(dict(skipped='budget', config=label, mode=mode))
                continue
            torch._dynamo.reset()
            torch.manual_seed(0)
            m = XCiT(arch=args.arch, compile_cfg=cfg).cuda()
            m.train(mode == 'train')
            set_parts(m, on)
            x = torch.randn(batch, 3, h, w, device='cuda')
            step = scenario_step(m, mode, amp, x)
            c0 = time.time()
            step()
            torch.cuda.synchronize()
            first = time.time() - c0
            torch.cuda.reset_peak_memory_stats()
            ms = timed(step, args.warmup, args.repeat)
            emit(dict(config=label, mode=mode, amp=amp, batch=batch, h=h,
                      w=w, ms=ms, compiled=cfg, first_call_s=first,
                      peak_gib=torch.cuda.max_memory_allocated() / 2**30))


if __name__ == '__main__':
    main()
