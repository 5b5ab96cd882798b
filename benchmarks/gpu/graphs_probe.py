"""Where a training step replayed by ``cuda_graphs`` spends its time.

On the H200 the AMP training step of XCiT-S12/16 (batch 2, 800x1344)
replayed by ``XCiT(cuda_graphs='train')`` took 26.5 ms where a bare CUDA
graph of the whole step replayed in 19.2 ms (launch_probe.py). This probe
splits the step, one process, CUDA events beside the CPU's clock:

* ``cpu_*_ms``: the CPU's time in each phase (zero_grad, the forward call
  with the model's fingerprint and the replay's launch, the loss, the
  backward call with the gradients' copies and their accumulation);
* ``gpu_*_ms``: the GPU's time between the events recorded after each
  phase (where the GPU waits for the CPU, its span is the CPU's);
* ``fingerprint_ms``: ``cuda_graphs.fingerprint`` alone, the CPU's look at
  the model before each replay;
* the same step eagerly (``cuda_graphs=False``) for comparison.

Run on a CUDA machine::

    python -m benchmarks.gpu.graphs_probe --out DIR [--size 800x1344]

Writes one JSON line per row to ``DIR/graphs_probe.jsonl`` as it goes.
"""
import argparse
import json
import os
import os.path as osp
import statistics
import time

import torch

from xcit_dense import XCiT
from xcit_dense.models.execution import cuda_graphs

PHASES = ('zero_grad', 'forward', 'loss', 'backward')


def split_step(model, x, repeat):
    """Medians of each phase's CPU time and of the GPU's time between the
    phases' events, over ``repeat`` steps after 4 warm-up steps (the
    graph is captured on the third)."""
    cpu = {p: [] for p in PHASES}
    gpu = {p: [] for p in PHASES}
    wall = []
    for i in range(4 + repeat):
        torch.cuda.synchronize()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
        clock = [time.perf_counter()]
        events[0].record()
        model.zero_grad(set_to_none=True)
        clock.append(time.perf_counter())
        events[1].record()
        with torch.autocast('cuda', dtype=torch.float16):
            outs = model(x)
        clock.append(time.perf_counter())
        events[2].record()
        loss = sum(o.float().sum() for o in outs)
        clock.append(time.perf_counter())
        events[3].record()
        loss.backward()
        clock.append(time.perf_counter())
        events[4].record()
        torch.cuda.synchronize()
        end = time.perf_counter()
        if i < 4:
            continue
        wall.append((end - clock[0]) * 1e3)
        for j, phase in enumerate(PHASES):
            cpu[phase].append((clock[j + 1] - clock[j]) * 1e3)
            gpu[phase].append(events[j].elapsed_time(events[j + 1]))
    row = dict(wall_ms=statistics.median(wall))
    for phase in PHASES:
        row[f'cpu_{phase}_ms'] = statistics.median(cpu[phase])
        row[f'gpu_{phase}_ms'] = statistics.median(gpu[phase])
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', required=True)
    parser.add_argument('--arch', default='small_12_p16')
    parser.add_argument('--size', default='800x1344')
    parser.add_argument('--repeat', type=int, default=20)
    args = parser.parse_args()
    h, w = map(int, args.size.split('x'))
    os.makedirs(args.out, exist_ok=True)
    results = osp.join(args.out, 'graphs_probe.jsonl')
    open(results, 'w').close()
    torch.manual_seed(0)
    x = torch.randn(2, 3, h, w, device='cuda')
    for graphs in ('train', False):
        model = XCiT(args.arch, cuda_graphs=graphs).cuda().train()
        row = dict(cuda_graphs=graphs, batch=2, precision='fp16 autocast',
                   **split_step(model, x, args.repeat))
        row['captures'] = model.training_graphs.captures
        start = time.perf_counter()
        for _ in range(args.repeat):
            cuda_graphs.fingerprint(model)
        row['fingerprint_ms'] = (time.perf_counter() - start) * 1e3 / \
            args.repeat
        row.update(arch=args.arch, size=args.size,
                   parameters=sum(1 for _ in model.parameters()),
                   gpu=torch.cuda.get_device_name(), torch=torch.__version__)
        print(json.dumps(row), flush=True)
        with open(results, 'a') as f:
            f.write(json.dumps(row) + '\n')
        del model
        torch.cuda.empty_cache()


if __name__ == '__main__':
    main()
