"""Which fast path pays on a GPU: every part of XCiT-S12/16 switched on and
off alone, eager and compiled, fp32 and fp16 autocast, inference and a
training step, in one process (CUDA events, medians; eager configurations in
rounds of rotated order).

The measurements behind the CUDA column of the fast-path policy
(``xcit_dense/models/policy.py``). Run on a CUDA machine::

    python docs/benchmark/gpu/policy_probe.py --out probe.json [--compile]

Prints one JSON line per measurement and writes them all to ``--out``.
"""
import argparse
import json
import os
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
    """Force the fast path of the parts in ``on`` ('always': whatever the
    policy says for this device) and the straightforward one elsewhere."""
    for m in model.modules():
        for name, cls in PARTS.items():
            if type(m) is cls:
                m.use_fast_path = 'always' if name in on else False


def _sync(device):
    if device == 'cuda':
        torch.cuda.synchronize()


def timed(step, warmup, repeat, device):
    """Median milliseconds of ``step`` (CUDA events on a GPU)."""
    for _ in range(warmup):
        step()
    _sync(device)
    times = []
    for _ in range(repeat):
        if device == 'cuda':
            start, end = (torch.cuda.Event(enable_timing=True)
                          for _ in range(2))
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            step()
            times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


def scenario_step(model, mode, amp, x):
    """Inference or a training step, under fp16 autocast (bf16 on the CPU)
    with ``amp`` as mmengine's AmpOptimWrapper runs it."""
    device = x.device.type
    dtype = torch.float16 if device == 'cuda' else torch.bfloat16

    def ctx():
        return torch.autocast(device, dtype=dtype, enabled=amp)
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


def _peak_gib(device):
    return torch.cuda.max_memory_allocated() / 2**30 \
        if device == 'cuda' else None


def _reset_peak(device):
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()


def rotations(items, rounds):
    """``rounds`` orders of ``items``, each starting ``len(items) /
    rounds`` further on, so that every item is measured early and late."""
    return [items[r * len(items) // rounds:] + items[:r * len(items) // rounds]
            for r in range(rounds)]


def eager_rows(args, scenarios, emit):
    """Every part on and off alone, eager, in ``--rounds`` rounds per
    scenario, each round starting at another configuration: in one
    process the order weighs (an H200 measured the AMP inference of the
    configuration measured first at 13.3 ms and of every later one, the
    positional encoding's cache alone included, at 19 to 24 ms), so each
    row is the median over rounds, with every round's time."""
    names = list(PARTS)
    configs = [('reference', set()), ('all', set(names))]
    configs += [(f'all-{n}', set(names) - {n}) for n in names]
    configs += [(f'ref+{n}', {n}) for n in names]
    torch.manual_seed(0)
    model = XCiT(arch=args.arch).to(args.device)
    for mode, amp, batch, (h, w) in scenarios:
        model.train(mode == 'train')
        x = torch.randn(batch, 3, h, w, device=args.device)
        step = scenario_step(model, mode, amp, x)
        times, peaks = {}, {}
        for order in rotations(configs, args.rounds):
            for label, on in order:
                set_parts(model, on)
                _reset_peak(args.device)
                times.setdefault(label, []).append(
                    timed(step, args.warmup, args.repeat, args.device))
                peaks[label] = _peak_gib(args.device)
        for label, _ in configs:
            emit(dict(config=label, mode=mode, amp=amp, batch=batch, h=h,
                      w=w, ms=statistics.median(times[label]),
                      ms_rounds=times[label], compiled=False,
                      peak_gib=peaks[label]))


def compiled_rows(args, scenarios, emit, t0):
    """The backbone's own compile_cfg (dynamic shapes), fast paths on, off,
    and XCA's off; the most important scenarios first."""
    names = list(PARTS)
    cfg = dict(dynamic=True, backend=args.compile_backend)
    for mode, amp, batch, (h, w) in scenarios:
        for label, on in [('all', set(names)), ('reference', set()),
                          ('xca-off', set(names) - {'xca', 'block'})]:
            if time.time() - t0 > args.budget_s:
                emit(dict(skipped='budget', config=label, mode=mode))
                continue
            torch._dynamo.reset()
            torch.manual_seed(0)
            m = XCiT(arch=args.arch, compile_cfg=cfg).to(args.device)
            m.train(mode == 'train')
            set_parts(m, on)
            x = torch.randn(batch, 3, h, w, device=args.device)
            step = scenario_step(m, mode, amp, x)
            c0 = time.time()
            step()
            _sync(args.device)
            first = time.time() - c0
            _reset_peak(args.device)
            ms = timed(step, args.warmup, args.repeat, args.device)
            emit(dict(config=label, mode=mode, amp=amp, batch=batch, h=h,
                      w=w, ms=ms, compiled=cfg, first_call_s=first,
                      peak_gib=_peak_gib(args.device)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--out', required=True)
    p.add_argument('--arch', default='small_12_p16')
    p.add_argument('--device', default='cuda')
    p.add_argument('--size', default=None,
                    help='HxW for every scenario (a quick check)')
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--repeat', type=int, default=10)
    p.add_argument('--rounds', type=int, default=3,
                   help='eager: every configuration this many times, each '
                        'round from another one (the median is the row)')
    p.add_argument('--compile', action='store_true')
    p.add_argument('--compile-backend', default='inductor')
    p.add_argument('--budget-s', type=float, default=400)
    args = p.parse_args()
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    scenarios = SCENARIOS
    if args.size:
        size = tuple(int(v) for v in args.size.split('x'))
        scenarios = [(m, a, b, size) for m, a, b, _ in SCENARIOS]
    rows, t0 = [], time.time()

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, 'w') as f:
            json.dump(rows, f, indent=1)

    eager_rows(args, scenarios, emit)
    if args.compile:
        compiled_rows(args, [scenarios[i] for i in (2, 0, 1)], emit, t0)


if __name__ == '__main__':
    main()
