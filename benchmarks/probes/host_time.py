"""The host's time for a call of CUDA's eager path, on the CPU or a GPU.

On a GPU the eager backbone is paced by the host (docs/performance.md,
"GPU"): what the CPU spends per call (our modules' Python, PyTorch's
dispatch and autograd, the calls that launch Triton's kernels) is the
call's time. This runs CUDA's path without a GPU: Triton's interpreter
with every kernel call counted and skipped (its outputs left as
allocated), the policy's CUDA column taken for the CPU (as
``tests/test_launches.py`` does), XCiT's blocks at a tiny width and input,
so that the operators' arithmetic is small beside their dispatch, under
fp16 autocast as the recipes train on GPUs. The default fast paths and the
straightforward computation (``fast_path=False``) alternate in rounds;
each row is the median of its steps, per round. What it does not see: a
real Triton launch (the launcher's Python and the driver's call) and
CUDA's own launch calls, which a GPU adds per kernel. ``--device cuda``
measures those: the same calls on a GPU (each call's time until the GPU
has finished it, the input so small that the host paces it), and one
Triton kernel's call against one PyTorch operator's (a pre-norm, 5
tokens, in the kernel and in ``nn.LayerNorm``: microseconds per call, the
GPU synchronised once per 200 calls)::

    python -m benchmarks.probes.host_time [--device cuda] [--arch small_12_p16]
        [--width 64] [--rounds 3] [--steps 15] [--out DIR]

Prints a line per row; with ``--out``, also writes them to
``DIR/host_time.jsonl`` as they come (a file of an earlier run is
replaced).
"""
import argparse
import json
import os
import os.path as osp
import statistics
import sys
import time


def cudas_column_on_the_cpu(policy) -> None:
    """The kernels' devices widened to the CPU and the policy's CUDA
    column taken for the CPU's."""
    policy.KERNEL_DEVICES = ('cpu', 'cuda')
    for part, devices in list(policy.POLICY.items()):
        policy.POLICY[part] = dict(devices, cpu=devices['cuda'])


class SkippedKernels:
    """Inside, on the CPU: each Triton kernel call is counted and not run
    (on a GPU: nothing)."""

    def __init__(self, device: str) -> None:
        self.device, self.calls = device, 0

    def __enter__(self) -> 'SkippedKernels':
        if self.device == 'cpu':
            from triton.runtime.interpreter import InterpretedFunction
            self.interpreted, self.run = InterpretedFunction, \
                InterpretedFunction.run

            def skipped(*args, **kwargs):
                self.calls += 1
            InterpretedFunction.run = skipped
        return self

    def __exit__(self, *exc) -> None:
        if self.device == 'cpu':
            self.interpreted.run = self.run


def per_launch_us(torch, calls: int = 200) -> dict:
    """Microseconds of one pre-norm's call on CUDA, in the Triton kernel
    and in ``nn.LayerNorm`` (medians of 5 runs of ``calls`` calls)."""
    from xcit_dense.models.ops.layer_norm_kernels import layer_norm
    norm = torch.nn.LayerNorm(64).cuda()
    x = torch.randn(1, 5, 64, device='cuda')
    result = {}
    for name, call in (('triton', lambda: layer_norm(x, norm, x.dtype)),
                       ('pytorch', lambda: norm(x))):
        runs = []
        with torch.no_grad():
            for _ in range(6):
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(calls):
                    call()
                torch.cuda.synchronize()
                runs.append((time.perf_counter() - start) / calls * 1e6)
        result[name] = statistics.median(runs[1:])
    return result


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', choices=('cpu', 'cuda'), default='cpu')
    parser.add_argument('--arch', default='small_12_p16')
    parser.add_argument('--width', type=int, default=64,
                        help='embed_dim (8 heads)')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--steps', type=int, default=15)
    parser.add_argument('--out', default=None,
                        help='a folder for host_time.jsonl')
    return parser.parse_args()


def calls(torch, args):
    """The timed calls, ``{'train': step, 'infer': call}``, and the
    model: fp16 autocast, a training step at batch 2 and inference at
    batch 1, each waiting for the GPU."""
    from xcit_dense import XCiT
    torch.manual_seed(0)
    model = XCiT(args.arch, embed_dim=args.width, num_heads=8).to(
        args.device)
    x = torch.randn(2, 3, 32, 48, device=args.device)
    x1 = x[:1]  # inference's input, sliced once
    done = torch.cuda.synchronize if args.device == 'cuda' else (
        lambda: None)

    def train_step():
        model.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=torch.float16):
            outs = model(x)
        sum(o.float().sum() for o in outs).backward()
        done()

    def inference():
        with torch.no_grad(), \
                torch.autocast(args.device, dtype=torch.float16):
            model(x1)
        done()
    return dict(train=train_step, infer=inference), model


def timed_row(args, call, setting: bool) -> tuple:
    """Milliseconds per call (median of ``--steps``) with the fast paths
    on (``setting``) or off, and the Triton kernel calls per call (on the
    CPU, counted and skipped; else None)."""
    from xcit_dense import fast_path
    with fast_path(setting, fused_kernels=False), \
            SkippedKernels(args.device) as kernels:
        call()  # the kernels' probes, the weights' casts
        kernels.calls = 0
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    counted = kernels.calls // args.steps if args.device == 'cpu' else None
    return statistics.median(times) * 1e3, counted


def main() -> None:
    args = parse_args()
    if args.device == 'cpu':
        os.environ['TRITON_INTERPRET'] = '1'  # before Triton is imported
    import torch

    from xcit_dense.models import policy
    from xcit_dense.models.ops import triton_support
    if not triton_support.available():
        sys.exit('error: this needs Triton (installed with PyTorch on '
                 'Linux x86-64).')
    if args.device == 'cuda' and not torch.cuda.is_available():
        sys.exit('error: --device cuda needs a CUDA GPU.')
    torch.set_num_threads(1)
    if args.device == 'cpu':
        cudas_column_on_the_cpu(policy)
    steps, model = calls(torch, args)
    out = None
    if args.out is not None:
        os.makedirs(args.out, exist_ok=True)
        out = open(osp.join(args.out, 'host_time.jsonl'), 'w')

    def record(line: str, **row) -> None:
        print(line, flush=True)
        if out is not None:
            out.write(json.dumps(dict(
                row, device=args.device, arch=args.arch,
                width=args.width)) + '\n')
            out.flush()

    print(f'XCiT {args.arch}, embed_dim {args.width}, {len(model.blocks)} '
          f'blocks, on {args.device}; training step: 2x3x32x48, inference: '
          f'1x3x32x48; fp16 autocast; ms per call (median of {args.steps})'
          + (', Triton kernel calls per call' if args.device == 'cpu'
             else ''))
    for rnd in range(args.rounds):
        for mode, call in steps.items():
            model.train(mode == 'train')
            for setting in (True, False):
                ms, kernels = timed_row(args, call, setting)
                name = 'default' if setting else 'straightforward'
                row = dict(round=rnd + 1, mode=mode, config=name, ms=ms)
                counted = ''
                if kernels is not None:
                    row['triton_kernels'] = kernels
                    counted = f' {kernels:4d} Triton kernels'
                record(f'round {rnd + 1} {mode} {name:15s} {ms:7.2f} ms'
                       f'{counted}', **row)
    if args.device == 'cuda':
        launch = per_launch_us(torch)
        record(f'one pre-norm call: Triton kernel {launch["triton"]:.1f} '
               f'us, nn.LayerNorm {launch["pytorch"]:.1f} us',
               mode='launch', triton_us=launch['triton'],
               pytorch_us=launch['pytorch'])
    if out is not None:
        out.close()


if __name__ == '__main__':
    main()
