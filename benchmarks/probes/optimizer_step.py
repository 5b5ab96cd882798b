"""The optimizer's step of a recipe with its parameter groups merged
(``NoDecayOptimWrapperConstructor``'s default) and with one group per
parameter (``paramwise_cfg=dict(merge_groups=False)``, mmengine's way).

The recipe's model and optimizer are built from its config (the backbone
not initialised from a checkpoint); every parameter gets the same random
gradient in both, and the two optimizers step in turn, ``--rounds`` rounds of
``--steps`` steps each. Per configuration: the parameter groups, the median
time of a step (CUDA: synchronised), the operators it dispatches on the
parameters, their gradients and moments (not on the per-parameter step
counts, 0-dimensional tensors on the CPU, whose reads are most of the rest:
on CUDA, whose optimizers take the multi-tensor path, each of those
operators launches at least one kernel; ``--foreach`` takes that path on
the CPU too), and at the end the largest difference between the two
models' parameters (0: merging changes no update)::

    python -m benchmarks.probes.optimizer_step [CONFIG] [--device cuda]
        [--foreach]
"""
import argparse
import copy
import os.path as osp
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


class _CountOps(TorchDispatchMode):
    """The operators dispatched on tensors of at least one dimension."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += any(isinstance(t, torch.Tensor) and t.dim() > 0
                        for t in tree_leaves((args, kwargs)))
        return func(*args, **kwargs)


def build(config: str, device: str, foreach: bool):
    """The recipe's model on ``device`` and its optimizer config (the
    wrapper a plain ``OptimWrapper``: the step timed is the optimizer's)."""
    from mmengine.config import Config

    import xcit_dense  # noqa: F401
    from benchmarks.harness.builders import optim_wrapper_config
    from xcit_dense.toolkits import use_toolkit
    cfg = Config.fromfile(config)
    cfg.model.backbone.init_cfg = None
    model = use_toolkit(cfg.default_scope).MODELS.build(cfg.model).to(device)
    wrapper = optim_wrapper_config(cfg.optim_wrapper, amp=False,
                                   device=device)
    if foreach:
        wrapper['optimizer'] = dict(wrapper['optimizer'], foreach=True)
    return model, wrapper


def optimizer_of(model, wrapper: dict, merge: bool):
    from mmengine.optim import build_optim_wrapper
    wrapper = copy.deepcopy(wrapper)
    wrapper['paramwise_cfg'] = dict(wrapper.get('paramwise_cfg') or {},
                                    merge_groups=merge)
    return build_optim_wrapper(model, wrapper).optimizer


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config', nargs='?',
                        default=osp.join(REPO, 'configs/coco/'
                                         'mask_rcnn_xcit_s12.py'))
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--steps', type=int, default=10)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--foreach', action='store_true',
                        help="the optimizer's multi-tensor path (CUDA's "
                        'default) on any device')
    args = parser.parse_args(argv)

    def sync():
        if args.device.startswith('cuda'):
            torch.cuda.synchronize()

    torch.manual_seed(0)
    model, wrapper = build(args.config, args.device, args.foreach)
    runs = {}
    for merge in (False, True):
        twin = copy.deepcopy(model)
        for p in twin.parameters():
            p.grad = torch.randn(p.shape, generator=torch.Generator(
                ).manual_seed(p.numel()), dtype=p.dtype).to(p.device)
        runs[merge] = dict(model=twin,
                           optimizer=optimizer_of(twin, wrapper, merge),
                           ms=[])
    for _ in range(args.rounds):
        for merge, run in runs.items():
            optimizer = run['optimizer']
            optimizer.step()  # the state made before timing
            sync()
            start = time.perf_counter()
            for _ in range(args.steps):
                optimizer.step()
            sync()
            run['ms'].append((time.perf_counter() - start) / args.steps * 1e3)
    for merge, run in runs.items():
        with _CountOps() as counted:
            run['optimizer'].step()
        sync()
        print(f'merge_groups={merge}: '
              f'{len(run["optimizer"].param_groups)} groups, '
              f'{statistics.median(run["ms"]):.2f} ms per step (rounds: '
              + ', '.join(f'{ms:.2f}' for ms in run['ms'])
              + f'), {counted.ops} operators per step on the parameters')
    diff = max((a - b).abs().max().item() for a, b in zip(
        runs[False]['model'].parameters(), runs[True]['model'].parameters()))
    print(f'{sum(1 for _ in model.parameters())} parameter tensors on '
          f'{args.device}; largest difference between the two models after '
          f'{args.rounds * (args.steps + 1) + 1} steps: {diff:g}')


if __name__ == '__main__':
    main()
