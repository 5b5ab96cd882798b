"""What a measurement runs: the model and input of a benchmark row
(:func:`subject`) and its timed step (:func:`step_of`): inference, a
training step, or a whole training iteration."""
import os.path as osp
from typing import Callable, List, NamedTuple, Optional

import torch

from xcit_dense.deploy.runtimes import runtime_session

from .builders import (
    build_backbone,
    build_detector,
    build_optim_wrapper,
    build_segmentor,
    build_segmentor_graph,
    example_input,
    segmentation_data,
)
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


def outputs(out) -> List:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def xcit_in(model):
    """The XCiT in ``model`` (itself, or a detector's or segmentor's
    backbone), or None."""
    from xcit_dense.models import XCiT
    backbone = getattr(model, 'backbone', model)
    return backbone if isinstance(backbone, XCiT) else None


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
