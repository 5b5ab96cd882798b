"""Where XCiT's time goes on a GPU: the launch overhead against the work.

XCiT-S12/16 (random weights) at one detection size, each variant measured in
one process with CUDA events (medians after warm-up):

* eager fp32, eager under bf16 / fp16 autocast, eager with bf16 weights;
  each with no part, XCA, LPI, or both on their Triton kernels (``triton``
  in each row: ``none``, ``xca``, ``lpi``, ``xca+lpi``);
* the same forwards, and the training steps (fp32, bf16 and fp16
  autocast: ``--amp`` is fp16 today), captured in a CUDA graph and replayed
  (the GPU's own time, without Python and launch overhead: what graphing
  would save; a step that cannot be captured records the error);
* ``torch.compile`` with static shapes (Inductor), inference and training;
* a profile of each eager forward: kernels launched and the sum of their
  GPU time, against the wall time.

Run on a CUDA machine::

    python -m benchmarks.gpu.launch_probe --out DIR [--size 800x1344] \
        [--triton none xca lpi xca+lpi] [--no-compile | --compile-only]

Writes one JSON line per measurement to ``DIR/launch_probe.jsonl`` (the
compiled rows alone, ``--compile-only``: ``DIR/launch_probe_compiled.jsonl``)
as it goes (a time limit keeps what was measured; a file of an earlier run
is replaced) and the profiles' top kernels to
``DIR/launch_probe_kernels.txt``.
"""
import argparse
import json
import os
import os.path as osp
import statistics
import time
from contextlib import nullcontext

import torch

from xcit_dense import XCiT
from xcit_dense.models.lpi import LPI
from xcit_dense.models.xca import XCA

#: which parts run their Triton kernels in a row
TRITON = {'none': (), 'xca': (XCA,), 'lpi': (LPI,), 'xca+lpi': (XCA, LPI)}


def median_ms(step, warmup=3, repeat=20):
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


def autocast(dtype):
    if dtype is None:
        return nullcontext()
    return torch.autocast('cuda', dtype=dtype, cache_enabled=False)


def graphed(fn, warmup=3):
    """``fn`` captured in a CUDA graph; returns the replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def profile(fn, name, out):
    """Kernels launched by one call of ``fn`` and their summed GPU time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    fn()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_us = sum(getattr(e, 'device_time', None) or
                 getattr(e, 'cuda_time', 0) for e in kernels)
    with open(osp.join(out, 'launch_probe_kernels.txt'), 'a') as f:
        f.write(f'\n## {name}: {len(kernels)} kernels, '
                f'{gpu_us / 1e3:.2f} ms of GPU time\n')
        f.write(prof.key_averages().table(
            sort_by='self_device_time_total', row_limit=20))
    return len(kernels), gpu_us / 1e3


def use_kernels(model, triton):
    """The parts named by ``triton`` (a key of :data:`TRITON`) on their
    fast path on CUDA (their Triton kernels), the others of XCA and LPI on
    their straightforward computation (the CUDA policy's default is the
    kernels), every other part as the policy says."""
    for module in model.modules():
        if type(module) in (XCA, LPI):
            module.use_fast_path = 'always' \
                if type(module) in TRITON[triton] else False


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', required=True)
    parser.add_argument('--arch', default='small_12_p16')
    parser.add_argument('--size', default='800x1344')
    parts = parser.add_mutually_exclusive_group()
    parts.add_argument('--no-compile', action='store_true',
                       help='the eager and graphed rows only')
    parts.add_argument('--compile-only', action='store_true',
                       help='the compiled rows only (the longest: '
                       'Inductor compiles the backbone three times)')
    parser.add_argument('--triton', nargs='+', choices=list(TRITON),
                        default=list(TRITON),
                        help='which parts on their Triton kernels, one row '
                        'each (default: all four)')
    args = parser.parse_args()
    h, w = map(int, args.size.split('x'))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.out, exist_ok=True)
    results = osp.join(args.out, 'launch_probe_compiled.jsonl'
                       if args.compile_only else 'launch_probe.jsonl')
    written = [results] if args.compile_only else \
        [results, osp.join(args.out, 'launch_probe_kernels.txt')]
    for path in written:  # this run's rows only
        open(path, 'w').close()

    def record(**row):
        row.update(arch=args.arch, size=args.size,
                   gpu=torch.cuda.get_device_name(), torch=torch.__version__)
        print(json.dumps(row), flush=True)
        with open(results, 'a') as f:
            f.write(json.dumps(row) + '\n')

    x1 = torch.randn(1, 3, h, w, device='cuda')
    x2 = torch.randn(2, 3, h, w, device='cuda')
    if not args.compile_only:
        eager_and_graphed(args, record, x1, x2)
    if not args.no_compile:
        compiled(args, record, x1, x2)


#: the precisions of the eager rows: (label, autocast dtype or None)
PRECISIONS = (('fp32', None), ('bf16 autocast', torch.bfloat16),
              ('fp16 autocast', torch.float16))


def eager_and_graphed(args, record, x1, x2):
    """The eager rows (with their profiles) and their CUDA-graph replays:
    inference at batch 1, training steps at batch 2."""
    torch.manual_seed(0)
    model = XCiT(args.arch).cuda().eval()
    for triton in args.triton:
        for label, dtype in PRECISIONS:
            use_kernels(model, triton)

            def infer(dtype=dtype):
                with torch.no_grad(), autocast(dtype):
                    return model(x1)
            ms = median_ms(infer)
            kernels, gpu_ms = profile(
                infer, f'infer b1 {label}, Triton kernels: {triton}',
                args.out)
            record(what='infer', batch=1, precision=label, triton=triton,
                   eager_ms=ms, kernels=kernels, kernel_gpu_ms=gpu_ms,
                   cuda_graph_ms=median_ms(graphed(infer)))
    use_kernels(model, 'none')
    bf16_weights(args, record, x1)
    model.train()
    for triton in args.triton:
        for label, dtype in PRECISIONS:
            use_kernels(model, triton)
            record(**training_row(args, model, x2, triton, label, dtype))


def bf16_weights(args, record, x1):
    """Inference of the backbone cast to bf16, eager and replayed."""
    bf16_model = XCiT(args.arch).cuda().eval().bfloat16()
    xb = x1.bfloat16()

    def infer_bf16_weights():
        with torch.no_grad():
            return bf16_model(xb)
    kernels, gpu_ms = profile(infer_bf16_weights, 'infer b1 bf16 weights',
                              args.out)
    record(what='infer', batch=1, precision='bf16 weights',
           eager_ms=median_ms(infer_bf16_weights), kernels=kernels,
           kernel_gpu_ms=gpu_ms,
           cuda_graph_ms=median_ms(graphed(infer_bf16_weights)))


def training_row(args, model, x2, triton, label, dtype) -> dict:
    """A training step's row: eager, profiled and replayed."""
    def train_step():
        with autocast(dtype):
            outs = model(x2)
        sum(o.float().sum() for o in outs).backward()
        model.zero_grad(set_to_none=True)
    torch.cuda.reset_peak_memory_stats()
    ms = median_ms(train_step, repeat=10)
    peak = torch.cuda.max_memory_allocated() / 2**30
    kernels, gpu_ms = profile(
        train_step, f'train b2 {label}, Triton kernels: {triton}', args.out)
    row = dict(what='train', batch=2, precision=label, triton=triton,
               eager_ms=ms, kernels=kernels, kernel_gpu_ms=gpu_ms,
               peak_gib=peak)
    # forward and backward in one graph: every replay recomputes the
    # gradients into the memory of the captured ones and updates
    # BatchNorm's running statistics, as an eager step does
    try:
        row['cuda_graph_ms'] = median_ms(graphed(train_step), repeat=10)
    except Exception as error:  # record and go on
        row['cuda_graph_error'] = repr(error)[:300]
    return row


def compiled(args, record, x1, x2):
    """The backbone compiled with static shapes (Inductor), bf16 autocast:
    inference (default and ``reduce-overhead``) and a training step."""
    for what, mode in (('infer', None), ('infer', 'reduce-overhead'),
                       ('train', None)):
        torch._dynamo.reset()
        fresh = XCiT(args.arch, compile_cfg=dict(
            dynamic=False, **({'mode': mode} if mode else {}))).cuda()
        fresh.train(what == 'train')
        x = x1 if what == 'infer' else x2

        def step(fresh=fresh, x=x, what=what):
            with autocast(torch.bfloat16):
                if what == 'infer':
                    with torch.no_grad():
                        return fresh(x)
                outs = fresh(x)
            sum(o.float().sum() for o in outs).backward()
            fresh.zero_grad(set_to_none=True)
        t = time.perf_counter()
        try:
            step()
            torch.cuda.synchronize()
        except Exception as error:  # record and go on
            record(what=what, compiled=mode or 'default',
                   error=repr(error)[:300])
            continue
        first = time.perf_counter() - t
        record(what=what, batch=x.shape[0], precision='bf16 autocast',
               compiled=mode or 'default', first_call_s=first,
               compile_failure=fresh.compile_failure,
               ms=median_ms(step, repeat=10 if what == 'train' else 20))


if __name__ == '__main__':
    main()
