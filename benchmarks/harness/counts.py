"""Multiply-adds of a measured row (the published design's, and what the
row's own variant executes), the achieved rate, and its outputs' difference
to the straightforward computation on the same weights."""
from typing import Optional

import torch

from .builders import build_backbone, build_exportable
from .names import DETECTORS
from .subjects import Subject, outputs, step_of, xcit_in


def training_counts(item: Subject, args, variants: set,
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
    backbone = xcit_in(item.model)
    if backbone is not None:
        backbone.compile_cfg = None
        backbone.cuda_graphs = False
    step = step_of(item, args, variants)
    with fast_path(False), FlopCounterMode(
            display=False, custom_mapping={
                torch.ops.aten.convolution_backward: conv_backward_flops
            }) as counter:
        step()
    gmac = counter.get_total_flops() / 2e9 / args.batch
    return dict(gmac_per_image=gmac,
                achieved_gflops_per_s=2 * gmac * args.batch / seconds)


def conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride,
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


def backbone_counts(item: Subject, base: str, variants: set, args,
                     out, seconds: float) -> dict:
    """Multiply-adds, the achieved rate and, for the fast path and the
    published code, the output difference to the straightforward
    computation on the same weights."""
    counts = count_gmac(item.model, base, variants, item.x[:1],
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
    counts['max_rel_diff_vs_reference'] = max_rel_diff(outputs(out), refs)
    return counts


def max_rel_diff(outs, refs) -> float:
    """The largest difference of ``outs`` to the (floating-point) ``refs``,
    each relative to its reference's largest value."""
    return max(((o.float() - r).abs().max() / r.abs().max()).item()
               for o, r in zip(outs, refs) if r.is_floating_point())


def diff_to_exported(base: str, out, x) -> dict:
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
    return dict(max_rel_diff_vs_reference=max_rel_diff(outs, refs))


def count_gmac(model, base: str, variants: set, x, device: str) -> dict:
    """Multiply-adds per image: ``gmac_per_image`` of the published design
    (mmengine's counter, whose trace takes the straightforward computation;
    every XCiT variant computes the same maths, so it is counted on an
    eval-mode model of the straightforward variant, not on the row's, which
    may train, checkpoint or compile) and, for the XCiT fast path,
    ``executed_gmac_per_image``: what the row's own variant executes
    (:func:`executed_gmac`)."""
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
    executed = executed_gmac(base, x, variants) if fast else None
    if executed is not None:
        counts['executed_gmac_per_image'] = executed
    return counts


def executed_gmac(base: str, x, variants: set) -> Optional[float]:
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
