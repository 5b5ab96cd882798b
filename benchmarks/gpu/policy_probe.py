"""Which fast path pays on a GPU: every part of XCiT-S12/16 switched on and
off alone, eager and compiled, fp32 and fp16 autocast, inference and a
training step, in one process (CUDA events, medians; eager configurations in
rounds of rotated order).

The measurements behind the CUDA column of the fast-path policy
(``xcit_dense/models/policy.py``). Eagerly, the rows are paced by the CPU's
launches, which hides the GPU time a part saves or costs; ``--graphs`` times
the same configurations replayed from the backbone's CUDA graphs
(``cuda_graphs=True`` for inference, ``'train'`` for the training steps: the
GPU's time alone), and XCA's second-moments route (the CPU's, two token
GEMMs where the ``qkv`` and ``proj`` layers are four) in place of its
Triton kernels. Run on a CUDA machine::

    python -m benchmarks.gpu.policy_probe --out probe.json \
        [--compile] [--graphs]

Prints one JSON line per measurement and writes them all to ``--out``.
"""
import argparse
import contextlib
import gc
import json
import os
import os.path as osp
import statistics
import time
from unittest import mock

import torch
import torch.nn as nn

from benchmarks.harness.matmul import synchronize
from xcit_dense import XCiT
from xcit_dense.models import xca
from xcit_dense.models.block import XCABlock
from xcit_dense.models.lpi import LPI
from xcit_dense.models.mlp import Mlp
from xcit_dense.models.positional_encoding import CachedFourierEncoding
from xcit_dense.models.pyramid import TransposedConvUpsampler
from xcit_dense.models.stem import ConvPatchEmbed
from xcit_dense.models.xca import XCA

PARTS = dict(stem=ConvPatchEmbed, pos=CachedFourierEncoding, xca=XCA,
             lpi=LPI, mlp=Mlp, block=XCABlock,
             pyramid=TransposedConvUpsampler)


def set_parts(model, on):
    """Force the fast path of the parts in ``on`` ('always': whatever the
    policy says for this device) and the straightforward one elsewhere;
    ``on=None``: the policy's default (``True``) everywhere."""
    if on is None:
        return
    for m in model.modules():
        for name, cls in PARTS.items():
            if type(m) is cls:
                m.use_fast_path = 'always' if name in on else False


def timed(step, warmup, repeat, device):
    """Median milliseconds of ``step`` (CUDA events on a GPU)."""
    for _ in range(warmup):
        step()
    synchronize(device)
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


def _reserved_gib(device):
    return torch.cuda.memory_reserved() / 2**30 \
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
    """Every part of ``--parts`` on and off alone (the others on, or off),
    eager, in ``--rounds`` rounds per
    scenario, each round starting at another configuration: in one
    process the order weighs (an H200 measured the AMP inference of the
    configuration measured first at 13.3 ms and of every later one, the
    positional encoding's cache alone included, at 19 to 24 ms), so each
    row is the median over rounds, with every round's time."""
    names, every = args.parts, set(PARTS)
    configs = [('reference', set()), ('all', every)]
    configs += [(f'all-{n}', every - {n}) for n in names]
    configs += [(f'ref+{n}', {n}) for n in names]
    torch.manual_seed(0)
    model = backbone(args).to(args.device)
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
                      ms_rounds=times[label], graphed=False, compiled=False,
                      peak_gib=peaks[label]))


def xca_from_second_moments():
    """XCA's fast path on its second-moments route where it would take its
    Triton kernels (plain ``nn.Linear`` layers), for the probe's
    ``+xca-moments`` rows."""
    kernels_or_other = XCA._fast_path

    def fast_path(self, x):
        path = kernels_or_other(self, x)
        if path == xca.KERNELS and type(self.qkv) is nn.Linear and \
                type(self.proj) is nn.Linear:
            return xca.SECOND_MOMENTS
        return path
    return mock.patch.object(XCA, '_fast_path', fast_path)


def graphed_configs(names):
    """(label, parts forced on or None for the policy's default, context)
    of the ``--graphs`` rows: each of the parts ``names`` off alone, the
    others on."""
    none, every = contextlib.nullcontext, set(PARTS)
    return [('reference', set(), none), ('default', None, none),
            ('all', every, none),
            *((f'all-{n}', every - {n}, none) for n in names),
            ('all+xca-moments', every, xca_from_second_moments)]


def graphed_rows(args, scenarios, emit):
    """Every configuration of :func:`graphed_configs` replayed from the
    backbone's CUDA graphs, a fresh model each (captured during the
    warm-up: inference on its first call, a training step on its third);
    a row whose steps were not all replays says so (``replayed``)."""
    for mode, amp, batch, (h, w) in scenarios:
        for label, on, context in graphed_configs(args.parts):
            torch.manual_seed(0)
            model = backbone(args, cuda_graphs=(
                'train' if mode == 'train' else True)).to(args.device)
            model.train(mode == 'train')
            set_parts(model, on)
            graphs = model.training_graphs if mode == 'train' \
                else model.graphs
            x = torch.randn(batch, 3, h, w, device=args.device)
            step = scenario_step(model, mode, amp, x)
            with context():
                for _ in range(max(args.warmup, 4)):
                    step()
                captures = graphs.captures
                _reset_peak(args.device)
                ms = timed(step, 0, args.repeat, args.device)
            emit(dict(config=label, mode=mode, amp=amp, batch=batch, h=h,
                      w=w, ms=ms, graphed=True, compiled=False,
                      replayed=captures == 1 and graphs.captures == 1
                      and graphs.failure is None,
                      failure=graphs.failure, peak_gib=_peak_gib(args.device),
                      reserved_gib=_reserved_gib(args.device)))
            del model, graphs, step
            gc.collect()  # the graphs and their memory pools with them
            if args.device == 'cuda':
                torch.cuda.empty_cache()


def backbone(args, **kwargs) -> XCiT:
    """``--arch``, with its first ``--depth`` blocks where given (its four
    last blocks tapped: a quick check)."""
    if args.depth:
        kwargs.update(depth=args.depth,
                      out_indices=tuple(range(args.depth))[-4:])
    return XCiT(arch=args.arch, **kwargs)


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
            m = backbone(args, compile_cfg=cfg).to(args.device)
            m.train(mode == 'train')
            set_parts(m, on)
            x = torch.randn(batch, 3, h, w, device=args.device)
            step = scenario_step(m, mode, amp, x)
            c0 = time.time()
            step()
            synchronize(args.device)
            first = time.time() - c0
            _reset_peak(args.device)
            ms = timed(step, args.warmup, args.repeat, args.device)
            emit(dict(config=label, mode=mode, amp=amp, batch=batch, h=h,
                      w=w, ms=ms, graphed=False, compiled=cfg,
                      first_call_s=first, peak_gib=_peak_gib(args.device)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--out', required=True)
    p.add_argument('--arch', default='small_12_p16')
    p.add_argument('--depth', type=int, default=None,
                   help="the preset's first DEPTH blocks (at least 4; "
                        'default: all of them)')
    p.add_argument('--device', default='cuda')
    p.add_argument('--size', default=None,
                    help='HxW for every scenario (a quick check)')
    p.add_argument('--parts', nargs='+', choices=list(PARTS),
                   default=list(PARTS),
                   help='the parts switched alone (default: all)')
    p.add_argument('--scenarios', type=int, nargs='+', default=None,
                   help='which of SCENARIOS (their indices; default: all)')
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--repeat', type=int, default=10)
    p.add_argument('--rounds', type=int, default=3,
                   help='eager: every configuration this many times, each '
                        'round from another one (the median is the row)')
    p.add_argument('--compile', action='store_true')
    p.add_argument('--graphs', action='store_true',
                   help='also every configuration replayed from CUDA graphs')
    p.add_argument('--compile-backend', default='inductor')
    p.add_argument('--budget-s', type=float, default=400)
    args = p.parse_args()
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    scenarios = SCENARIOS
    if args.size:
        size = tuple(int(v) for v in args.size.split('x'))
        scenarios = [(m, a, b, size) for m, a, b, _ in SCENARIOS]
    if args.scenarios is not None:
        scenarios = [scenarios[i] for i in args.scenarios]
    rows, t0 = [], time.time()

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, 'w') as f:
            json.dump(rows, f, indent=1)

    eager_rows(args, scenarios, emit)
    if args.graphs:
        graphed_rows(args, scenarios, emit)
    if args.compile:
        compiled_rows(args, [scenarios[i] for i in (2, 0, 1)], emit, t0)


if __name__ == '__main__':
    main()
