"""Building mmengine's Runner for a config, fitted to the machine: a GPU
recipe on a machine without one (fp32, BatchNorm, gloo), the hooks and
checkpoint backend every run needs, the CPU process group."""
import inspect

import torch
from mmengine.config import ConfigDict
from mmengine.optim import AmpOptimWrapper, OptimWrapper

from .errors import UserError
from .toolkits import type_name

REQUIRED_HOOKS = ('CheckpointImportHook', 'PreemptionHook')

#: what mmengine's AmpOptimWrapper takes and its OptimWrapper does not
#: (``loss_scale``, ``dtype``, ``use_fsdp``)
AMP_ONLY_ARGUMENTS = tuple(sorted(
    name for name, p in inspect.signature(AmpOptimWrapper).parameters.items()
    if p.kind is not p.VAR_KEYWORD and
    name not in inspect.signature(OptimWrapper).parameters))


def add_required_hooks(cfg, **arguments: dict) -> None:
    """Make sure the runner converts published checkpoints and checks every
    loaded one strictly, saves a checkpoint on SIGTERM / SIGINT / SIGUSR1
    (:mod:`xcit_dense.hooks`) and writes checkpoints atomically, also when a
    config replaced the recipe's ``custom_hooks`` or checkpoint hook.
    ``arguments``: a required hook's arguments, by its name (tools/test.py:
    ``CheckpointImportHook=dict(allow_new_classes=False)``), set on the
    config's entry or the one added."""
    hooks = list(cfg.get('custom_hooks') or [])
    for name in REQUIRED_HOOKS:
        hook = next((h for h in hooks
                     if type_name(h) == name), None)
        if hook is None:
            hook = dict(type=f'xcit_dense.{name}')
            hooks.append(hook)
        hook.update(arguments.get(name, {}))
    cfg.custom_hooks = hooks
    checkpoint = (cfg.get('default_hooks') or {}).get('checkpoint')
    if checkpoint is not None and not checkpoint.get('backend_args'):
        checkpoint['backend_args'] = dict(backend='atomic_local')


def use_amp(cfg) -> None:
    """``--amp``, as mmdet's and mmseg's ``tools/train.py`` give it: the
    config's ``OptimWrapper`` becomes mmengine's ``AmpOptimWrapper`` with
    dynamic loss scaling (the type named with or without its scope)."""
    wrapper = cfg.optim_wrapper
    name = type_name(wrapper) or 'OptimWrapper'
    if name == 'AmpOptimWrapper':
        print('AMP training is already enabled in your config.')
    elif name == 'OptimWrapper':
        wrapper.type = 'AmpOptimWrapper'
        wrapper.loss_scale = 'dynamic'
    else:
        raise UserError(
            '--amp turns mmengine\'s OptimWrapper into its '
            'AmpOptimWrapper, and this config\'s optimizer wrapper is '
            f'{wrapper.type!r}: drop --amp, or give the config a wrapper '
            'that trains in mixed precision itself (AmpOptimWrapper or a '
            'subclass of it).')


def without_amp(wrapper) -> None:
    """Make an optimizer wrapper config mmengine's plain ``OptimWrapper``
    (fp32), without the arguments only ``AmpOptimWrapper`` takes."""
    wrapper['type'] = 'OptimWrapper'
    for name in AMP_ONLY_ARGUMENTS:  # OptimWrapper refuses them
        wrapper.pop(name, None)


def adapt_to_machine(cfg) -> None:
    """Fit a GPU recipe to a machine without one, saying what changed."""
    if torch.cuda.is_available():
        return
    notes = []
    wrapper = cfg.get('optim_wrapper') or {}
    if type_name(wrapper) == 'AmpOptimWrapper':
        without_amp(wrapper)
        notes.append("fp32 training (mmengine's AmpOptimWrapper needs a GPU)")
    if cfg.get('sync_bn') or replace_syncbn(cfg.get('model')):
        cfg.sync_bn = None
        notes.append('BatchNorm instead of SyncBN')
    env = cfg.setdefault('env_cfg', ConfigDict())
    env.setdefault('dist_cfg', ConfigDict())['backend'] = 'gloo'
    if cfg.get('launcher', 'none') != 'none':
        # DDP over CPU processes takes no device_ids (mmengine's default
        # passes LOCAL_RANK); otherwise as mmengine's default wrapper.
        cfg.model_wrapper_cfg = dict(
            type='MMDistributedDataParallel', device_ids=None,
            broadcast_buffers=False,
            find_unused_parameters=cfg.get('find_unused_parameters', False))
        notes.append('multi-process training over gloo')
    if notes:
        print(f'No GPU: {"; ".join(notes)}.', flush=True)


def keep_fp32_without_bf16_kernels(cfg) -> None:
    """Under bf16 AMP (an ``AmpOptimWrapper`` with ``dtype='bfloat16'``,
    what ``--amp --cfg-options optim_wrapper.dtype=bfloat16`` gives), the
    model's mmcv modules whose kernels take no bf16
    (:data:`~xcit_dense.precision.WITHOUT_BF16_KERNELS`: the RoI heads'
    RoIAlign, Mask2Former's deformable attention) run in fp32, through a
    :class:`~xcit_dense.precision.Float32PartsHook` of their types (added
    unless the config has one with types), saying so; under bf16 they stop
    the first iteration (``"roi_align_forward_cuda_kernel" not implemented
    for 'BFloat16'``)."""
    from .precision import WITHOUT_BF16_KERNELS
    wrapper = cfg.get('optim_wrapper') or {}
    if type_name(wrapper) != 'AmpOptimWrapper' or \
            str(wrapper.get('dtype')).split('.')[-1] != 'bfloat16':
        return
    hooks = list(cfg.get('custom_hooks') or [])
    if not any(type_name(h) == 'Float32PartsHook' and h.get('types')
               for h in hooks):
        hooks.append(dict(type='xcit_dense.Float32PartsHook',
                          types=list(WITHOUT_BF16_KERNELS)))
        cfg.custom_hooks = hooks
        print("bf16 AMP: mmcv's RoIAlign, deformable attention and "
              'deformable convolutions, which have no bf16 kernels, run in '
              'fp32 (xcit_dense.Float32PartsHook).', flush=True)


def replace_syncbn(node) -> bool:
    """Turn every ``dict(type='SyncBN')`` below ``node`` into BatchNorm."""
    found = False
    if isinstance(node, dict):
        if node.get('type') == 'SyncBN':
            node['type'] = 'BN'
            found = True
        for value in node.values():
            found |= replace_syncbn(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            found |= replace_syncbn(value)
    return found


def maybe_init_cpu_distributed(cfg) -> None:
    """Start the gloo process group for CPU-only multi-process runs (mmengine
    would call torch.cuda.set_device, which needs a GPU)."""
    if cfg.get('launcher', 'none') != 'pytorch' or torch.cuda.is_available():
        return
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group(backend='gloo')


def build_runner(cfg):
    """mmengine's Runner for ``cfg``, fitted to this machine first."""
    adapt_to_machine(cfg)
    keep_fp32_without_bf16_kernels(cfg)
    add_required_hooks(cfg)
    maybe_init_cpu_distributed(cfg)
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    return Runner.from_cfg(cfg) if 'runner_type' not in cfg else \
        RUNNERS.build(cfg)


def finish_distributed() -> None:
    """Leave the process group cleanly (gloo may abort at interpreter exit
    otherwise)."""
    import gc

    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        gc.collect()  # what still holds the group (a DDP reducer) first
        dist.barrier()
        dist.destroy_process_group()
