"""How far one training step's gradients under autocast lie from fp32's,
part by part of a model.

The COCO Mask2Former demo trained on an H200 with fp16 AMP
(``tools/dist_train.sh CONFIG 1 --amp``) ended at 0.097 box and 0.114 mask
mAP, below its four fp32 runs on the CPU (0.111 to 0.149 / 0.133 to 0.178),
where the four other demos trained with AMP landed beside theirs. On the
CPU fp16 autocast trains it as fp32 does
(``benchmarks/probes/fp16_training_on_cpu.py``) and gives fp32's gradients to
rounding (below), so what CUDA runs in fp16 that the CPU does not is the
suspect: mmcv's multi-scale deformable attention kernel, which runs in the
value's dtype (fp16 under AMP; on the CPU it falls back to
``grid_sample``, which autocast keeps in fp32), and which Mask2Former's
published code keeps out of autocast (its pixel decoder's
``forward_features`` runs under ``autocast(enabled=False)``: "deformable
detr does not support half precision"). Since, the recipes run their pixel
decoder so too (``xcit_dense.Float32MSDeformAttnPixelDecoder``); mmdet's,
which that GPU run had, is probed by naming it::

    --cfg-options \
        model.panoptic_head.pixel_decoder.type=mmdet.MSDeformAttnPixelDecoder

(as ``make gpu-report STEP=demos`` does; the weights are the same).

For batches of a config's training data (the model initialised as the
config says, or ``--checkpoint``), the gradients of the summed losses:

* ``fp32``: in fp32 (TF32 off), and a second time (``rerun``: the floor
  that nondeterministic kernels set; 0 on the CPU);
* ``autocast``: under ``torch.autocast`` in ``--dtype``, the loss scaled
  by ``--loss-scale`` and the gradients unscaled, as AMP's scaler does;
* ``autocast, fp32 PART``: the same with each of ``--fp32-parts`` run in
  fp32 (autocast off inside it, its floating inputs cast to fp32, as
  ``xcit_dense.Float32PartsHook`` runs it), as the published Mask2Former
  runs its pixel decoder;
* ``autocast, fp32 TYPE``: the same with every module of each class of
  ``--fp32-types`` in fp32, its outputs handed back in its input's dtype
  (``Float32PartsHook(types=...)``; default mmcv's
  ``MultiScaleDeformableAttention``: the deformable attention alone, not
  the pixel decoder's other layers).

Each row: a variant's summed loss beside fp32's, the fraction of
predictions its matchers (each module's ``assigner``) assigned as in fp32,
and its distance to ``fp32`` per part (the parameters under each module
``--depth`` names deep, and ``all``), ``|g - g32| / |g32|`` over the part's
gradients, and whether they are all finite. The same random points are
sampled for every variant (the generator re-seeded).
On the CPU (2-core Intel Xeon with AMX, PyTorch 2.12.1, fp16, three
batches, two runs: one thread and two), with the COCO Mask2Former demo
trained 800 iterations under fp16 AMP on the CPU (``--checkpoint``): the
losses within 0.15 % of fp32's, every prediction assigned as in fp32, all
gradients 1.6e-3 to 1.1e-2 from fp32's, the backbone's blocks 3.1e-3 to
2.1e-2, the pixel decoder 4.2e-3 to 1.4e-2 (1.7e-3 to 1.4e-2 with it in
fp32), the transformer decoder 6.2e-3 to 2.5e-2, all finite (the same
batch's distance moves up to 2x with the threads' summation order);
untrained (the config's initialisation, one run) all 1.3e-2 to 6.9e-2.
Run on a CUDA machine::

    python -m benchmarks.gpu.amp_gradients --out DIR \\
        [--config configs/coco/demo_mask2former_xcit_nano_synthetic.py] \\
        [--checkpoint FILE] [--batches 3] [--dtype float16]

(``make gpu-report STEP=demos`` runs it after the demos, on the COCO
Mask2Former demo's checkpoint where it trained.)

Writes one JSON line per batch and variant to ``DIR/amp_gradients.jsonl``
as it goes (``--device cpu`` on the CPU, where fp16 convolutions'
backward is slow: ``--dtype bfloat16`` there, or patience).
"""
import argparse
import json
import os
import os.path as osp
import tempfile

import torch

from xcit_dense.cli import add_cfg_options, load_config
from xcit_dense.precision import autocast_part, instances
from xcit_dense.toolkits import type_name

DEMO = 'configs/coco/demo_mask2former_xcit_nano_synthetic.py'


def part_of(name, depth):
    return '.'.join(name.split('.')[:depth])


class Assignments(list):
    """While entered, the ``gt_inds`` of every assignment made by the
    model's matchers (each module's ``assigner``: Mask2Former's Hungarian
    matcher, an RPN's IoU assigner), in order."""

    def __init__(self, model):
        super().__init__()
        self.assigners = [m.assigner for m in model.modules()
                          if hasattr(getattr(m, 'assigner', None), 'assign')]

    def __enter__(self):
        for assigner in self.assigners:
            def assign(*args, _assign=assigner.assign, **kwargs):
                result = _assign(*args, **kwargs)
                self.append(result.gt_inds.detach().cpu())
                return result
            assigner.assign = assign  # on the instance, removed on exit
        return self

    def __exit__(self, *exc):
        for assigner in self.assigners:
            del assigner.assign

    def agreement(self, reference):
        """The fraction of predictions assigned as in ``reference``."""
        if [a.shape for a in self] != [a.shape for a in reference]:
            return None
        same = sum(int((a == b).sum()) for a, b in zip(self, reference))
        return same / max(sum(a.numel() for a in reference), 1)


def step(model, data, seed, dtype=None, loss_scale=1.0):
    """The summed losses, their gradients by parameter name (unscaled) and
    the matchers' assignments, the random generator seeded with ``seed``
    first."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    device = next(model.parameters()).device.type
    with torch.autocast(device, dtype=dtype or torch.float32,
                        enabled=dtype is not None), \
            Assignments(model) as assignments:
        losses = model(**data, mode='loss')
    loss = sum(value for key, value in losses.items() if 'loss' in key)
    (loss * loss_scale).backward()
    grads = {n: p.grad.detach().float() / loss_scale
             for n, p in model.named_parameters() if p.grad is not None}
    return float(loss), grads, assignments


def distances(grads, reference, depth):
    """``|g - g_ref| / |g_ref|`` and finiteness by part and for all."""
    parts = {}
    for name in reference:
        parts.setdefault(part_of(name, depth), []).append(name)
    parts['all'] = list(reference)
    rows = {}
    for part, names in parts.items():
        missing = [n for n in names if n not in grads]
        if missing:
            rows[part] = dict(missing=missing[:3])
            continue
        diff = torch.stack([(grads[n] - reference[n]).pow(2).sum()
                            for n in names]).sum().sqrt()
        norm = torch.stack([reference[n].pow(2).sum()
                            for n in names]).sum().sqrt()
        rows[part] = dict(
            relative=float(diff / norm.clamp_min(1e-30)),
            finite=all(bool(torch.isfinite(grads[n]).all())
                       for n in names))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', required=True)
    parser.add_argument('--config', default=DEMO)
    parser.add_argument('--checkpoint')
    parser.add_argument('--batches', type=int, default=3)
    parser.add_argument('--dtype', default='float16',
                        choices=['float16', 'bfloat16'])
    parser.add_argument('--loss-scale', type=float, default=2048.0)
    parser.add_argument('--fp32-parts', nargs='*',
                        default=['panoptic_head.pixel_decoder'])
    parser.add_argument('--fp32-types', nargs='*',
                        default=['MultiScaleDeformableAttention'])
    parser.add_argument('--depth', type=int, default=2)
    parser.add_argument('--device', default='cuda')
    add_cfg_options(parser)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = osp.join(args.out, 'amp_gradients.jsonl')
    saved = (torch.backends.cudnn.allow_tf32,
             torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        probe(args, results)
    finally:
        (torch.backends.cudnn.allow_tf32,
         torch.backends.cuda.matmul.allow_tf32) = saved


def build(args, work_dir):
    """The config's model in training mode on ``args.device`` and its
    training data loader (a runner built as tools/train.py builds it)."""
    from mmengine.runner import load_checkpoint

    from xcit_dense.runner import build_runner
    cfg = load_config(args.config, args.cfg_options)
    cfg.work_dir = work_dir
    cfg.load_from = None
    backbone = cfg.model.get('backbone') or {}
    if type_name(backbone) == 'XCiT':
        # every step eager: a CUDA graph captured after the third step of
        # one size would replay the same computation, after a warm-up
        # between the variants
        backbone['cuda_graphs'] = False
    runner = build_runner(cfg)
    model = runner.model.to(args.device)
    if args.checkpoint:
        load_checkpoint(model, args.checkpoint, map_location=args.device,
                        strict=True)
    model.train()
    return model, runner.build_dataloader(cfg.train_dataloader)


def probe(args, results):
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory() as work_dir:
        model, loader = build(args, work_dir)
        batches = iter(loader)
        for batch in range(args.batches):
            data = model.data_preprocessor(next(batches), True)
            reference = step(model, data, batch)
            variants = {
                'rerun': step(model, data, batch),
                'autocast': step(model, data, batch, dtype,
                                 args.loss_scale)}
            in_fp32 = [(part, [model.get_submodule(part)], False)
                       for part in args.fp32_parts] + [
                (name, instances(model, name), True)
                for name in args.fp32_types]
            for label, modules, in_input_dtype in in_fp32:
                handles = [h for module in modules for h in autocast_part(
                    module, torch.float32, in_input_dtype=in_input_dtype)]
                try:
                    variants[f'autocast, fp32 {label}'] = step(
                        model, data, batch, dtype, args.loss_scale)
                finally:
                    for handle in handles:
                        handle.remove()
            for variant, (loss, grads, assignments) in variants.items():
                row = dict(batch=batch, variant=variant,
                           dtype=args.dtype if variant != 'rerun'
                           else 'float32',
                           device=str(next(model.parameters()).device),
                           loss=loss, fp32_loss=reference[0],
                           assigned_as_fp32=assignments.agreement(
                               reference[2]),
                           parts=distances(grads, reference[1],
                                           args.depth))
                with open(results, 'a') as f:
                    f.write(json.dumps(row) + '\n')
                print(variant, f'loss {loss:.4f} (fp32 {reference[0]:.4f})',
                      f"assigned as fp32: {row['assigned_as_fp32']}",
                      {k: v.get('relative') for k, v in
                       row['parts'].items()}, flush=True)


if __name__ == '__main__':
    main()
