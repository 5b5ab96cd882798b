"""Which inputs ``cuda_graphs='auto'`` captures when more sizes recur than
graphs are kept (detection's padded sizes at batch 1).

Streams of input sizes (uniform or Zipf-distributed over 8 to 40 sizes, and
one whose sizes change halfway) go through ``GraphedInference`` with a
stand-in for the capture (no GPU: the counts are the policy's, not a
timing), once as it is (a new input captured only if it came
``ADMISSION`` times as often as the least used kept graph's, which it
replaces) and once with every recurring input captured and the least
recently used graph dropped (the rule admission replaced). Each row counts
captures, replays and eager calls, and prices them in eager forwards: a
replay 0.30 (AMP inference of XCiT-S12/16 at 800x1344 on the H200, 3.7 ms
against 12.4 ms eagerly, docs/performance.md), a capture ``--capture``
(two warm-up forwards, the captured one and the graph's instantiation)::

    python -m benchmarks.probes.graph_admission [--calls 5000] [--capture 4]
"""
import argparse
import random
from unittest import mock

import torch
import torch.nn as nn

from xcit_dense.models.execution import cuda_graphs
from xcit_dense.models.execution.cuda_graphs import recurrence

REPLAY = 3.7 / 12.4


def stream(kind: str, n: int, calls: int, seed: int = 0):
    """``calls`` sizes drawn from ``n`` (``'shift'``: ``n`` sizes, then
    ``n`` others halfway)."""
    rng = random.Random(seed)
    weights = [1.0] * n if kind == 'uniform' else \
        [1 / (i + 1) for i in range(n)]
    for i in range(calls):
        offset = n if kind == 'shift' and i >= calls // 2 else 0
        yield (1, 1, 1, offset + rng.choices(range(n), weights)[0] + 1)


def run(sizes, capture_cost: float, replays: list) -> dict:
    """Captures, replays and eager calls of ``sizes`` under ``'auto'``
    (``replays``: one item per replay of the stand-in's graphs)."""
    graphs = cuda_graphs.GraphedInference()
    model = nn.Identity()
    counts = dict(captures=0, replays=0, eager=0)
    for shape in sizes:
        x = torch.zeros(shape)
        captures, replayed = graphs.captures, len(replays)
        with torch.no_grad():
            graphs(model, lambda t: (t, ), x, auto=True)
        counts['captures' if graphs.captures > captures else
               'replays' if len(replays) > replayed else 'eager'] += 1
    calls = sum(counts.values())
    counts['eager_forwards_per_call'] = (
        REPLAY * counts['replays'] + counts['eager'] +
        capture_cost * counts['captures']) / calls
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--calls', type=int, default=5000)
    parser.add_argument('--capture', type=float, default=4.0)
    args = parser.parse_args()

    replays = []

    def capture(forward, x, pool):
        static = x.clone()
        return static, tuple(forward(static)), (
            lambda: replays.append(None)), pool

    def lru(self, recurrence):
        return next(iter(self.graphs))
    print(f'| sizes | policy | captures | replays | eager | eager forwards '
          f'per call (capture = {args.capture:g}) |\n'
          '| --- | --- | --- | --- | --- | --- |')
    with mock.patch.object(cuda_graphs.GraphedInference, 'capture',
                           staticmethod(capture)):
        for kind, n in (('uniform', 8), ('uniform', 10), ('zipf', 20),
                        ('uniform', 20), ('zipf', 40), ('uniform', 40),
                        ('shift', 10)):
            for policy in ('admission', 'lru'):
                patches = [] if policy == 'admission' else [
                    mock.patch.object(recurrence, 'ADMISSION', 0),
                    mock.patch.object(cuda_graphs.GraphedInference,
                                      '_least_used', lru)]
                for patch in patches:
                    patch.start()
                row = run(stream(kind, n, args.calls), args.capture,
                          replays)
                for patch in patches:
                    patch.stop()
                print(f"| {n} {kind} | {policy} | {row['captures']} | "
                      f"{row['replays']} | {row['eager']} | "
                      f"{row['eager_forwards_per_call']:.2f} |", flush=True)


if __name__ == '__main__':
    main()
