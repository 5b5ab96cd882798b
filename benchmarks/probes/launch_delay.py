"""How long a graphed training step's call takes to launch its graph, on
the CPU.

``XCiT(cuda_graphs='train')`` replays a captured step; whatever the CPU
does before the replay's launch (counting the input, looking at the model)
the GPU waits for. This times it without a GPU: a stand-in for the capture
whose graphed forward records the time it is called, on XCiT-S12 (its 319
modules are what the look at the model walks), the steps' input tiny. Also
times ``cuda_graphs.fingerprint`` alone. ``--module`` runs an older
commit's ``xcit_dense/models/cuda_graphs.py`` (from ``git show
COMMIT:xcit_dense/models/cuda_graphs.py > FILE``) for a side by side
comparison::

    python -m benchmarks.probes.launch_delay [--module FILE] [--steps 60]
"""
import argparse
import importlib.util
import statistics
import sys
import time
from unittest import mock

import torch

from xcit_dense import XCiT
from xcit_dense.models.execution import cuda_graphs


def graphs_module(path):
    """``cuda_graphs`` as in the file ``path`` (None: the package's)."""
    if path is None:
        return cuda_graphs
    spec = importlib.util.spec_from_file_location(
        'xcit_dense.models._cuda_graphs_compared', path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--module', default=None)
    parser.add_argument('--arch', default='small_12_p16')
    parser.add_argument('--steps', type=int, default=60)
    args = parser.parse_args()
    graphs = graphs_module(args.module)
    launched = []

    def capture(step, x, pool):
        params = tuple(p for p in step.parameters() if p.requires_grad)

        class Replay(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, *_):
                launched.append(time.perf_counter())
                return (x.sum().expand(4), )

            @staticmethod
            def backward(ctx, grad):
                return (None, *(torch.zeros_like(p) for p in params))
        return (lambda x: Replay.apply(x, *params)), pool or object()
    # the CPU graphed with the stand-in, as the tests do; undone after
    with mock.patch.object(graphs.GraphedTraining, 'capture',
                           staticmethod(capture)):
        torch.manual_seed(0)
        model = XCiT(args.arch).train()
        training_graphs = graphs.GraphedTraining()
        weight = next(model.parameters())
        x = torch.randn(1, 3, 32, 32)
        delays = []
        for i in range(args.steps):
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            outs = training_graphs(
                model, lambda t: ((t.sum() * weight.sum()).expand(4), ), x)
            if training_graphs.captures and i >= 10:
                delays.append((launched[-1] - start) * 1e3)
            outs[0].sum().backward()
    start = time.perf_counter()
    for _ in range(args.steps):
        graphs.fingerprint(model)
    fingerprint_ms = (time.perf_counter() - start) * 1e3 / args.steps
    delay = statistics.median(delays)
    print(f'{args.module or graphs.__file__}: call to launch {delay:.3f} ms '
          f'(median of {len(delays)} steps), fingerprint '
          f'{fingerprint_ms:.3f} ms, {args.arch}, captures '
          f'{training_graphs.captures}')


if __name__ == '__main__':
    main()
