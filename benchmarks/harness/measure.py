"""One measurement, in the process that runs it (``tools/benchmark.py``
starts a fresh process per measurement: ``python -m
benchmarks.harness.measure``, arguments as the tool's hidden worker
options). Prints one JSON line."""
import argparse
import json
import os
import os.path as osp
import resource
import statistics
import time
from typing import Callable, Dict, List, NamedTuple, Optional

import torch

from xcit_dense.cli import run_cli
from xcit_dense.deploy import random_input
from xcit_dense.deploy.runtimes import runtime_session

from .builders import (
    build_backbone,
    build_detector,
    build_exportable,
    build_optim_wrapper,
    build_segmentor,
    build_segmentor_graph,
    example_input,
    segmentation_data,
)
from .matmul import synchronize
from .names import DETECTORS, RUNTIMES, SEGMENTORS, parse_model


class Subject(NamedTuple):
    """What one measurement runs: ``forward()`` of ``model`` (``None`` for
    an ONNX runtime) on its input ``x`` (``None`` for mm models, which take
    their own batch), whether its output is a loss dict, and the optimizer
    wrapper of a whole training iteration (``@iter``: ``forward()`` runs
    its backward and optimizer step too), else None."""
    model: Optional[torch.nn.Module]
    forward: Callable
    x: Optional[torch.Tensor]
    losses: bool
    iteration: Optional[object] = None


def onnx_file(out_dir: str, model: str, size) -> str:
    """Where the ONNX export of ``model`` at ``size`` is written (its INT8
    model with ``_int8`` before the suffix)."""
    base, variants = parse_model(model)
    int8 = '_int8' if 'int8' in variants else ''
    return osp.join(out_dir, 'onnx', f'{base}_{size[0]}x{size[1]}{int8}.onnx')


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


def idle_graph_pool_bytes(snapshot: dict) -> int:
    """Bytes that CUDA graphs' private memory pools hold unallocated
    (``torch.cuda.memory._snapshot()``: segments of pool ``(0, 0)`` are the
    caching allocator's own). ``torch.cuda.max_memory_allocated`` misses
    them: a graph's activations are allocated once, at its capture."""
    return sum(seg['total_size'] - seg['allocated_size']
               for seg in snapshot['segments']
               if tuple(seg.get('segment_pool_id', (0, 0))) != (0, 0))


def outputs(out) -> List:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def subject(args, base: str, variants: set) -> Subject:
    """Build the model and input of the measurement."""
    h, w = args.size
    runtime = next(iter(variants & set(RUNTIMES)), None)
    if runtime is not None:  # the exported file; no PyTorch model
        session = runtime_session(runtime, onnx_file(
            args.out_dir, args.model, args.size), args.threads)
        x = example_input(base, args.batch, args.size)
        x_np = x.numpy()
        return Subject(None, lambda: session(x_np), x, False)
    if base in SEGMENTORS and args.mode == 'train':
        model = build_segmentor(base, variants, args.device).to(args.device)
        data = segmentation_data(model.train(), args.batch, h, w)
        return _training_subject(args, base, variants, model, data)
    if base in SEGMENTORS:
        torch.manual_seed(0)
        model = build_segmentor_graph(base, variants).to(args.device)
        x = example_input(base, args.batch, args.size)
        return Subject(model, lambda: model(x), x, False)
    if base in DETECTORS:
        return _detector_subject(args, base, variants)
    if 'published' in variants:
        from .published import build_published
        model = build_published(args.published_code, base[len('xcit_'):])
    else:
        model = build_backbone(base, variants)
    model = model.to(args.device)
    model.train(args.mode == 'train')
    x = torch.randn(args.batch, 3, h, w, device=args.device)
    return Subject(model, lambda: model(x), x, False)


def _detector_subject(args, base: str, variants: set) -> Subject:
    """A detector on mmdet's demo inputs: 5 boxes and masks per image."""
    from mmdet.testing import demo_mm_inputs
    h, w = args.size
    training = args.mode == 'train'
    model = build_detector(base, variants).to(args.device).train(training)
    packed = demo_mm_inputs(batch_size=args.batch, image_shapes=(3, h, w),
                            num_classes=80, num_items=[5] * args.batch,
                            with_mask=True)
    for sample in packed['data_samples']:
        sample.set_metainfo(dict(scale_factor=(1.0, 1.0), ori_shape=(h, w)))
    if training:
        return _training_subject(args, base, variants, model, packed)
    data = model.data_preprocessor(packed)
    inputs, samples = data['inputs'], data['data_samples']
    return Subject(model, lambda: model.predict(inputs, samples), None,
                   False)


def _training_subject(args, base: str, variants: set, model,
                      data: dict) -> Subject:
    """A detector's or segmentor's training on ``data`` (a batch as the
    data loader gives it). ``@iter``: ``model.train_step`` with the
    recipe's optimizer wrapper, a whole iteration as mmengine's loop runs
    it (the data preprocessor, the loss, its backward, the optimizer's step
    and the gradients cleared); else the loss of the batch preprocessed
    once, the step adding its backward."""
    if 'iter' in variants:
        wrapper = build_optim_wrapper(base, model, 'amp' in variants,
                                      args.device)
        return Subject(model, lambda: model.train_step(data, wrapper), None,
                       True, iteration=wrapper)
    data = model.data_preprocessor(data, training=True)
    inputs, samples = data['inputs'], data['data_samples']
    return Subject(model, lambda: model.loss(inputs, samples), None, True)


def step_of(item: Subject, args, variants: set) -> Callable:
    """One timed step: inference without autograd, a training step (the
    loss, or the sum of the outputs, backward), or a whole iteration
    (``@iter``); ``@amp`` under autocast as mmengine's
    ``AmpOptimWrapper.optim_context`` (an iteration on CUDA: in its own
    ``AmpOptimWrapper``)."""
    forward = item.forward
    # a training iteration on CUDA autocasts in its AmpOptimWrapper (fp16)
    if 'amp' in variants and not (item.iteration is not None and
                                  args.device == 'cuda'):
        dtype = torch.float16 if args.device == 'cuda' else torch.bfloat16

        def forward():
            with torch.autocast(args.device, dtype=dtype):
                return item.forward()
    if args.mode == 'infer':
        def step():
            with torch.no_grad():
                return forward()
        return step
    if item.iteration is not None:
        return forward

    def train_step():
        item.model.zero_grad(set_to_none=True)
        out = forward()
        loss = item.model.parse_losses(out)[0] if item.losses else \
            sum(o.float().sum() for o in outputs(out))
        loss.backward()
    return train_step


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
    CPU the process's peak RSS."""
    if args.device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        base_mem = torch.cuda.memory_allocated() / 2**30
    else:
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
    else:  # ru_maxrss is in KiB on Linux
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        row['memory'] = 'peak RSS of the process'
    row.update(peak_mem_gib=peak, activation_mem_gib=peak - base_mem,
               seconds=statistics.median(times))
    row['images_per_s'] = args.batch / row['seconds']
    return dict(row, out=out)


def measure_here(args) -> dict:
    """One measurement in this (fresh) process."""
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
        row.update(_diff_to_exported(base, out, item.x))
    elif args.mode == 'infer' and item.x is not None:
        row.update(_backbone_counts(item, base, variants, args, out,
                                    row['seconds']))
    elif args.mode == 'train':
        del out
        row.update(_training_counts(item, args, variants, row['seconds']))
    return row


def _training_counts(item: Subject, args, variants: set,
                     seconds: float) -> dict:
    """Multiply-adds of one training step per image, forward and backward
    (``gmac_per_image``), and the achieved rate: the published design's
    products, counted by ``torch.utils.flop_counter`` on one more step of
    the same model with every fast path off, eagerly (the counter sees
    neither Triton's kernels nor oneDNN's custom operators; a compiled or
    graphed backbone is made eager first, at the end of the measurement).
    With ``cp`` the recomputed forward is counted: it is executed work."""
    from torch.utils.flop_counter import FlopCounterMode

    from xcit_dense.models import fast_path
    backbone = _xcit_in(item.model)
    if backbone is not None:
        backbone.compile_cfg = None
        backbone.cuda_graphs = False
    step = step_of(item, args, variants)
    with fast_path(False), FlopCounterMode(
            display=False, custom_mapping={
                torch.ops.aten.convolution_backward: _conv_backward_flops
            }) as counter:
        step()
    gmac = counter.get_total_flops() / 2e9 / args.batch
    return dict(gmac_per_image=gmac,
                achieved_gflops_per_s=2 * gmac * args.batch / seconds)


def _xcit_in(model):
    """The XCiT in ``model`` (itself, or a detector's or segmentor's
    backbone), or None."""
    from xcit_dense.models import XCiT
    backbone = getattr(model, 'backbone', model)
    return backbone if isinstance(backbone, XCiT) else None


def fallbacks(model) -> dict:
    """What the XCiT in ``model`` (itself, or a detector's or segmentor's
    backbone) did instead of what the row's name asked for: its failed
    compilation (it then ran eagerly), and its CUDA graphs' captures and
    why they stopped, so that a ``@compile`` or ``@graphs`` row that ran
    eagerly says so; and which Triton kernels ran in the row's process, or
    the error that sent their part to its straightforward computation."""
    from xcit_dense.models import policy
    from xcit_dense.models.ops import triton_support
    backbone = _xcit_in(model)
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


def _conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride,
                         _padding, _dilation, transposed, _output_padding,
                         _groups, output_mask, out_shape) -> int:
    """A convolution's backward: the input's and the weight's gradients,
    each as many multiply-adds as the forward. (``torch.utils.flop_counter``
    counts a grouped convolution's weight gradient as if every group saw
    every channel: a depth-wise 3x3 convolution of 128 channels, forward
    and backward, at 130 times its forward instead of 3.)"""
    from torch.utils.flop_counter import conv_flop_count
    forward = conv_flop_count(x_shape, w_shape, grad_out_shape, transposed)
    return forward * (int(output_mask[0]) + int(output_mask[1]))


def _backbone_counts(item: Subject, base: str, variants: set, args,
                     out, seconds: float) -> dict:
    """Multiply-adds, the achieved rate and, for the fast path and the
    published code, the output difference to the straightforward
    computation on the same weights."""
    counts = _count_gmac(item.model, base, variants, item.x[:1],
                         args.device)
    gmac = counts.get('executed_gmac_per_image', counts['gmac_per_image'])
    counts['achieved_gflops_per_s'] = 2 * gmac * args.batch / seconds
    if 'published' in variants:
        from .published import straightforward_twin
        reference = straightforward_twin(item.model, base[len('xcit_'):])
    elif base.startswith('xcit_') and 'reference' not in variants:
        reference = build_backbone(base, {'reference'})
        reference.load_state_dict(item.model.state_dict())
    else:
        return counts
    with torch.no_grad():
        refs = reference.to(args.device).eval()(item.x)
    counts['max_rel_diff_vs_reference'] = _max_rel_diff(outputs(out), refs)
    return counts


def _max_rel_diff(outs, refs) -> float:
    """The largest difference of ``outs`` to the (floating-point) ``refs``,
    each relative to its reference's largest value."""
    return max(((o.float() - r).abs().max() / r.abs().max()).item()
               for o, r in zip(outs, refs) if r.is_floating_point())


def _diff_to_exported(base: str, out, x) -> dict:
    """Largest difference of the (float) outputs to the straightforward
    fp32 PyTorch computation with the same weights, relative to its largest
    value."""
    from xcit_dense.models import fast_path
    reference = build_exportable(base)
    with torch.no_grad(), fast_path(False):
        refs = reference(x)
    outs = [torch.as_tensor(o) for o in outputs(out)]
    if base in DETECTORS:  # as many detections as the exported PyTorch graph
        return dict(detections=len(outs[1]), detections_pytorch=len(refs[1]))
    return dict(max_rel_diff_vs_reference=_max_rel_diff(outs, refs))


def _count_gmac(model, base: str, variants: set, x, device: str) -> dict:
    """Multiply-adds per image: ``gmac_per_image`` of the published design
    (mmengine's counter, whose trace takes the straightforward computation;
    every XCiT variant computes the same maths, so it is counted on an
    eval-mode model of the straightforward variant, not on the row's, which
    may train, checkpoint or compile) and, for the XCiT fast path,
    ``executed_gmac_per_image``: what the row's own variant executes
    (:func:`_executed_gmac`)."""
    from mmengine.analysis import FlopAnalyzer
    fast = base.startswith('xcit_') and not variants & {'reference',
                                                          'published'}
    counted = build_backbone(base, {'reference'}).to(device).eval() \
        if fast else model
    with torch.no_grad():
        flops = FlopAnalyzer(counted, x)
        flops.unsupported_ops_warnings(False)
        flops.uncalled_modules_warnings(False)
        counts = dict(gmac_per_image=flops.total() / 1e9)
    executed = _executed_gmac(base, x, variants) if fast else None
    if executed is not None:
        counts['executed_gmac_per_image'] = executed
    return counts


def _executed_gmac(base: str, x, variants: set) -> Optional[float]:
    """Multiply-adds the row's XCiT executes on ``x`` (inference) where its
    fast paths compute other products than the published design: on the
    CPU, and in compiled code on any device (the modules' algebraic fast
    paths, XCA from second moments). ``None`` for eager CUDA, whose fast
    paths (XCA's and LPI's Triton kernels, folded layers) compute the
    published design's products.

    Counted by ``torch.utils.flop_counter`` on an eager CPU copy built with
    the row's own switches and precision, so that each row counts the
    routes it takes: the default policy's (XCA from second moments only
    with enough tokens per channel,
    :func:`~xcit_dense.models.ops.second_moments.pays`, whose threshold
    depends on the precision: ``@bf16``'s autocast, the step's autocast of
    ``@amp``), every fast path for ``@always``. The CPU's policy lists the
    same parts as compiled code's on either device. Under the counter's
    dispatch mode the fast paths run in standard operators
    (:func:`~xcit_dense.models.policy.operators_observed`) with the
    arithmetic they execute otherwise in oneDNN's custom operators, which
    the counter cannot see into."""
    from torch.utils.flop_counter import FlopCounterMode
    if x.device.type == 'cuda' and 'compile' not in variants:
        return None
    model = build_backbone(base, variants - {'compile', 'graphs'}).eval()
    # the step's autocast (@amp: float16 on CUDA, bfloat16 on the CPU; both
    # half precision for the route's threshold)
    autocast = torch.autocast('cpu', dtype=torch.bfloat16,
                              enabled='amp' in variants)
    with torch.no_grad(), autocast, FlopCounterMode(display=False) as counter:
        model(x.cpu())
    return counter.get_total_flops() / 2e9  # the counter: 2 per multiply-add


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
