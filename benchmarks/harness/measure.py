"""One measurement, in the process that runs it (``tools/benchmark.py``
starts a fresh process per measurement: ``python -m
benchmarks.harness.measure``, arguments as the tool's hidden worker
options). Prints one JSON line."""
import argparse
import json
import os
import resource
import statistics
import time
from typing import Callable, Dict, List, Optional

import torch

from xcit_dense.cli import run_cli
from xcit_dense.deploy import random_input

from .builders import build_exportable
from .counts import backbone_counts, diff_to_exported, training_counts
from .matmul import synchronize
from .names import SEGMENTORS, parse_model
from .subjects import onnx_file, step_of, subject, xcit_in

#: random images the speed measurement's INT8 models are calibrated on
#: (their accuracy is not measured here; tools/export_onnx.py --int8
#: calibrates on the dataset and checks the result)
CALIBRATION_IMAGES = 4


def export_row(args) -> dict:
    """Export (and verify) the model at the size, in this process; for an
    ``int8`` model, quantize the fp32 file exported before it."""
    from xcit_dense.deploy import export_onnx
    base, variants = parse_model(args.model)
    path = onnx_file(args.out_dir, args.model, args.size)
    start = time.perf_counter()
    if 'int8' in variants:
        from xcit_dense.deploy.quantization import quantize_int8
        images = [random_input(args.batch, 3, *args.size, images=True,
                               seed=i).numpy()
                  for i in range(CALIBRATION_IMAGES)]
        quantize_int8(onnx_file(args.out_dir, base, args.size), path,
                      images)
        return dict(export_s=time.perf_counter() - start, onnx_file=path,
                    export_max_rel_diff=None)
    rows = export_onnx(build_exportable(base), path, args.batch, *args.size,
                       log=lambda _: None)
    return dict(export_s=time.perf_counter() - start, onnx_file=path,
                export_max_rel_diff=max(r.get('max_rel_diff', 0.)
                                        for r in rows))


def _rss_gib() -> float:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**30


def restart_peak_rss() -> bool:
    """For a row measured in a process that measured others (``--in-process``):
    the memory earlier rows freed handed back to the system (glibc's
    ``malloc_trim``), then the process's peak resident set restarted from
    its resident set now (Linux's ``/proc/self/clear_refs``); False where
    it cannot be (the peak is then the process's since it started)."""
    import ctypes
    import gc
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        return False
    return True


def _peak_rss_gib() -> float:
    """The process's peak resident set (since :func:`restart_peak_rss`)."""
    with open('/proc/self/status') as f:
        line = next(x for x in f if x.startswith('VmHWM:'))
    return int(line.split()[1]) / 2**20  # in KiB


def idle_graph_pool_bytes(snapshot: dict) -> int:
    """Bytes that CUDA graphs' private memory pools hold unallocated
    (``torch.cuda.memory._snapshot()``: segments of pool ``(0, 0)`` are the
    caching allocator's own). ``torch.cuda.max_memory_allocated`` misses
    them: a graph's activations are allocated once, at its capture."""
    return sum(seg['total_size'] - seg['allocated_size']
               for seg in snapshot['segments']
               if tuple(seg.get('segment_pool_id', (0, 0))) != (0, 0))


def timed(step: Callable, args) -> Dict:
    """Times (median after warm-up, the first call apart) and peak memory
    of ``step``; ``'out'``: the last step's output. On CUDA also the
    median time until the step returned to the CPU, before the wait for
    the GPU (``host_seconds``: near the whole time, the GPU waited for the
    CPU's launches, or for a value the step read back from it; well below,
    the CPU waited for the GPU), and the peak is the
    timed steps' (not a compilation's or a graph capture's during the
    warm-up): the most memory allocated at once, plus the memory CUDA
    graphs' private pools hold unallocated (a replayed graph's activations
    live there; no other tensor can use it), and the most reserved; on the
    CPU the process's peak RSS (in a process that measured other rows,
    since this one's steps began where :func:`restart_peak_rss` can say)."""
    restarted = False
    if args.device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        base_mem = torch.cuda.memory_allocated() / 2**30
    else:
        restarted = getattr(args, 'in_process', False) and restart_peak_rss()
        base_mem = _rss_gib()
    times, returned, row, out = [], [], {}, None
    for i in range(args.warmup + args.repeat):
        if i == args.warmup and args.device == 'cuda':
            torch.cuda.reset_peak_memory_stats()
        out = None  # the previous step's outputs are not this one's memory
        synchronize(args.device)
        start = time.perf_counter()
        out = step()
        back = time.perf_counter()
        synchronize(args.device)
        if i == 0:
            row['first_call_s'] = time.perf_counter() - start
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
            returned.append(back - start)
    if args.device == 'cuda':
        row['host_seconds'] = statistics.median(returned)
        idle = idle_graph_pool_bytes(torch.cuda.memory._snapshot()) / 2**30
        peak = torch.cuda.max_memory_allocated() / 2**30 + idle
        row['memory'] = 'cuda max allocated + idle graph pools'
        row['graph_pools_idle_gib'] = idle
        row['peak_reserved_gib'] = torch.cuda.max_memory_reserved() / 2**30
    elif restarted:
        peak = _peak_rss_gib()
        row['memory'] = 'peak RSS of the process during the steps'
    else:  # ru_maxrss is in KiB on Linux
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        row['memory'] = 'peak RSS of the process' + (
            ' (earlier rows included)' if getattr(args, 'in_process', False)
            else '')
    row.update(peak_mem_gib=peak, activation_mem_gib=peak - base_mem,
               seconds=statistics.median(times))
    row['images_per_s'] = args.batch / row['seconds']
    return dict(row, out=out)


def measure_here(args) -> dict:
    """One measurement in this process (a fresh one, or with
    ``--in-process`` the tool's)."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.mode == 'export':
        return export_row(args)
    base, variants = parse_model(args.model)
    item = subject(args, base, variants)
    row = dict(model=args.model, h=args.size[0], w=args.size[1],
               batch=args.batch, mode=args.mode, threads=args.threads,
               device=args.device)
    row.update(timed(step_of(item, args, variants), args))
    row.update(fallbacks(item.model))
    if item.iteration is not None:  # what the iteration's step ran
        row.update(optim_wrapper=type(item.iteration).__name__,
                   param_groups=len(item.iteration.optimizer.param_groups))
    out = row.pop('out')
    # counted after the peak memory is read: the counters trace the model
    if item.model is None or (base in SEGMENTORS and not item.losses):
        row.update(diff_to_exported(base, out, item.x))
    elif args.mode == 'infer' and item.x is not None:
        row.update(backbone_counts(item, base, variants, args, out,
                                    row['seconds']))
    elif args.mode == 'train':
        del out
        row.update(training_counts(item, args, variants, row['seconds']))
    return row


def fallbacks(model) -> dict:
    """What the XCiT in ``model`` (itself, or a detector's or segmentor's
    backbone) did instead of what the row's name asked for: its failed
    compilation (it then ran eagerly), and its CUDA graphs' captures and
    why they stopped, so that a ``@compile`` or ``@graphs`` row that ran
    eagerly says so; and which Triton kernels ran in the row's process, or
    the error that sent their part to its straightforward computation."""
    from xcit_dense.models import policy
    from xcit_dense.models.ops import triton_support
    backbone = xcit_in(model)
    if backbone is None:
        return {}
    row = {}
    device = next(backbone.parameters()).device.type
    kernels = triton_support.verdicts(device) \
        if device in policy.KERNEL_DEVICES else {}
    if kernels:
        row['triton_kernels'] = kernels
    if backbone.compile_failure is not None:
        row['compile_failure'] = backbone.compile_failure[:300]
    for name in ('graphs', 'training_graphs'):
        graphs = getattr(backbone, name)
        if graphs.captures or graphs.failure is not None:
            row[f'{name}_captures'] = graphs.captures
        if graphs.failure is not None:
            row[f'{name}_failure'] = graphs.failure[:300]
    return row


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--model', required=True)
    parser.add_argument('--size', required=True,
                        type=lambda t: tuple(map(int, t.split('x'))))
    parser.add_argument('--batch', type=int, required=True)
    parser.add_argument('--mode', required=True)
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--threads', type=int, default=os.cpu_count())
    parser.add_argument('--repeat', type=int, default=3)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--out-dir', default='work_dirs/benchmark')
    parser.add_argument('--published-code', default=None)
    print(json.dumps(measure_here(parser.parse_args(argv))))


if __name__ == '__main__':
    run_cli(main)
