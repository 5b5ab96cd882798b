"""What ``tools/train.py`` and ``tools/test.py`` share: loading a config,
checking its inputs before anything is written, and fitting it to the
machine (CPU-only machines, CPU multi-process training)."""
import argparse
import os
import os.path as osp
import sys
from typing import Iterator, List, Mapping, Optional, Tuple

import torch
from mmengine.config import Config, ConfigDict, DictAction

from .checkpoint import is_url, local_checkpoint, read_checkpoint
from .checkpoint.published import is_published
from .errors import CheckpointError, UserError, XCiTDenseError


def fail(error: BaseException) -> None:
    """Print a one-paragraph error and exit with status 1."""
    message = str(error)
    if 'Original Traceback' in message:  # raised in a DataLoader worker
        message = message.strip().splitlines()[-1].split(': ', 1)[-1]
    print(f'error: {message}', file=sys.stderr)
    sys.exit(1)


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """Load a config file, or the config of a model of the model index
    (e.g. ``mask_rcnn_xcit_s12_p16_3x_coco``)."""
    from .model_index import config_file, models
    found = config_file(path)
    if found is None:
        names = ', '.join(sorted(models())[:4])
        raise UserError(f'Config file not found: {path} (neither a file nor '
                        f'a model of the model index, e.g. {names}, ...)')
    try:
        cfg = Config.fromfile(found)
        if cfg_options:
            cfg.merge_from_dict(cfg_options)
    except (TypeError, ValueError, KeyError, SyntaxError, ImportError,
            FileNotFoundError) as e:
        raise UserError(f'Cannot load the config {path}: '
                        f'{type(e).__name__}: {e}') from e
    return cfg


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options train.py and test.py share, as in mmdet and mmseg."""
    parser.add_argument('--work-dir',
                        help='the dir to save logs, models and metrics')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction, default={},
        help='override settings in the config, key=value, e.g. '
        'model.backbone.init_cfg.checkpoint=pretrained/xcit.pth')
    parser.add_argument(
        '--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none', help='job launcher')
    # torch.distributed.launch passes --local-rank / --local_rank
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def config_from_args(args: argparse.Namespace) -> Config:
    """Load ``args.config`` with the shared options applied; the work dir is
    the command line's, else the config's, else
    ``./work_dirs/<config name>``."""
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    cfg = load_config(args.config, args.cfg_options)
    cfg.launcher = args.launcher
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
    return cfg


def _datasets(cfg) -> Iterator[Tuple[str, dict]]:
    """(split, dataset config) of every dataloader, wrappers unwrapped."""
    for split in ('train', 'val', 'test'):
        loader = cfg.get(f'{split}_dataloader')
        if not loader:
            continue
        stack = [loader.get('dataset')]
        while stack:
            ds = stack.pop()
            if not ds:
                continue
            if 'dataset' in ds:
                stack.append(ds['dataset'])
            elif 'datasets' in ds:
                stack.extend(ds['datasets'])
            else:
                yield split, ds


def check_datasets(cfg, splits) -> None:
    """Every annotation file and image / label directory must exist."""
    for split, ds in _datasets(cfg):
        if split not in splits:
            continue
        root = ds.get('data_root') or ''
        where = (f'the {split} dataset ({ds.get("type")}, data_root='
                 f'{root!r})')
        hint = (f'Generate or download the data, or point the config at it, '
                f'e.g. --cfg-options {split}_dataloader.dataset.data_root='
                '/path/to/data')
        if root and not osp.isdir(root):
            raise UserError(f'The data root of {where} does not exist: '
                            f'{root}. {hint}')
        ann = ds.get('ann_file')
        if ann:
            path = ann if osp.isabs(ann) else osp.join(root, ann)
            # mmseg's ann_file is optional and may name a split list.
            if not osp.isfile(path):
                raise UserError(f'The annotation file of {where} does not '
                                f'exist: {path}. {hint}')
        prefix = ds.get('data_prefix') or {}
        for key, rel in prefix.items():
            path = rel if osp.isabs(rel) else osp.join(root, rel)
            if rel and not osp.isdir(path):
                raise UserError(f'The {key} directory of {where} does not '
                                f'exist: {path}. {hint}')


def check_evaluators(cfg, splits) -> None:
    """Annotation files the evaluators read (mmdet's CocoMetric) must
    exist."""
    for split in splits:
        evaluators = cfg.get(f'{split}_evaluator') or []
        for evaluator in (evaluators if isinstance(evaluators, (list, tuple))
                          else [evaluators]):
            ann = (evaluator or {}).get('ann_file')
            if ann and not osp.isfile(ann):
                raise UserError(
                    f'The annotation file of the {split} evaluator '
                    f'({evaluator.get("type")}) does not exist: {ann}. Point '
                    f'the config at it, e.g. --cfg-options {split}_evaluator.'
                    'ann_file=/path/to/annotations.json')


def check_backbone(cfg) -> None:
    """Validate an XCiT backbone config before anything is built."""
    backbone = (cfg.get('model') or {}).get('backbone') or {}
    if str(backbone.get('type', '')).split('.')[-1] != 'XCiT':
        return
    from .models.presets import DEFAULT_ARCH, check_out_indices, resolve_arch
    try:
        settings = resolve_arch(
            backbone.get('arch', DEFAULT_ARCH),
            **{k: backbone.get(k) for k in ('patch_size', 'embed_dim',
                                            'depth', 'num_heads', 'eta')})
        check_out_indices(backbone.get('out_indices'), settings['depth'])
    except ValueError as e:
        raise UserError(f'Bad backbone in the config (model.backbone): {e}')


def read_checked(path: str, what: str) -> Tuple[str, Mapping]:
    """The local path of the checkpoint at ``path`` (a file or an http(s)
    URL, downloaded once into torch's hub cache) and its contents; a missing
    or unreadable one is a :class:`UserError` naming ``what`` it is."""
    hint = (' Pass a local file or an http(s) URL, e.g. --cfg-options '
            'model.backbone.init_cfg.checkpoint=PATH_OR_URL.'
            if 'pretrained' in what else '')
    if not is_url(path) and not osp.isfile(str(path)):
        raise UserError(f'The {what} does not exist: {path}.{hint}')
    try:
        local = local_checkpoint(path)
        return local, read_checkpoint(local)
    except CheckpointError as e:
        raise UserError(f'The {what} cannot be used: {e}')


def check_checkpoint(path: str, what: str) -> str:
    """Check the checkpoint at ``path`` (see :func:`read_checked`) and
    return its local path."""
    return read_checked(path, what)[0]


def check_inputs(cfg, training: bool) -> None:
    """Fail early, before a work dir is written, on missing or bad inputs.

    Checkpoints given as URLs are downloaded here (once) and the config is
    pointed at the local copy, which is then read without arbitrary
    unpickling like any other file."""
    check_backbone(cfg)
    check_datasets(cfg, ('train', 'val') if training else ('test', ))
    check_evaluators(cfg, ('val', ) if training else ('test', ))
    if training:
        init = ((cfg.get('model') or {}).get('backbone') or {}).get(
            'init_cfg') or {}
        if init.get('type') == 'Pretrained':
            init['checkpoint'] = check_checkpoint(init.get('checkpoint'),
                                                  'pretrained checkpoint')
        checkpoint = None
        if cfg.get('resume') and not cfg.get('load_from'):
            # --resume without a path: the newest complete checkpoint of the
            # work dir (none: the run starts from the beginning)
            cfg.load_from, checkpoint = checkpoint_to_resume(cfg.work_dir)
        elif cfg.get('load_from'):
            what = ('checkpoint to resume from' if cfg.get('resume') else
                    'checkpoint to start from (load_from)')
            cfg.load_from, checkpoint = read_checked(cfg.load_from, what)
        if checkpoint is not None and cfg.get('resume') and \
                is_published(checkpoint):
            raise UserError(
                f'Cannot resume from {cfg.load_from}: it is a published '
                'XCiT checkpoint (mmdet 2 / mmseg 0 layout) with no '
                'optimizer or scheduler state of this toolkit. Fine-tune '
                'from it with --cfg-options load_from=FILE (no --resume) '
                'or evaluate it with tools/test.py.')


REQUIRED_HOOKS = ('CheckpointImportHook', 'PreemptionHook')


def add_required_hooks(cfg) -> None:
    """Make sure the runner converts published checkpoints and checks every
    loaded one strictly, saves a checkpoint on SIGTERM / SIGINT / SIGUSR1
    (:mod:`xcit_dense.hooks`) and writes checkpoints atomically, also when a
    config replaced the recipe's ``custom_hooks`` or checkpoint hook."""
    hooks = list(cfg.get('custom_hooks') or [])
    for name in REQUIRED_HOOKS:
        if not any(str(h.get('type', '')).split('.')[-1] == name
                   for h in hooks):
            hooks.append(dict(type=f'xcit_dense.{name}'))
    cfg.custom_hooks = hooks
    checkpoint = (cfg.get('default_hooks') or {}).get('checkpoint')
    if checkpoint is not None and not checkpoint.get('backend_args'):
        checkpoint['backend_args'] = dict(backend='atomic_local')


def complete_checkpoints(work_dir: str) -> List[str]:
    """The checkpoints a run in ``work_dir`` may resume from, newest first:
    the one ``last_checkpoint`` names, then ``iter_*.pth`` / ``epoch_*.pth``
    by decreasing number."""
    import re

    from mmengine.runner import find_latest_checkpoint
    if not osp.isdir(work_dir):
        return []
    numbered = []
    for name in os.listdir(work_dir):
        m = re.fullmatch(r'(iter|epoch)_(\d+)\.pth', name)
        if m:
            numbered.append((m.group(1) == 'iter', int(m.group(2)),
                             osp.join(work_dir, name)))
    ordered = [p for *_, p in sorted(numbered, reverse=True)]
    latest = find_latest_checkpoint(work_dir)
    if latest:
        ordered = [latest] + [p for p in ordered
                              if osp.abspath(p) != osp.abspath(latest)]
    return ordered


def checkpoint_to_resume(work_dir: str
                         ) -> Tuple[Optional[str], Optional[Mapping]]:
    """The newest complete checkpoint of ``work_dir`` (``--resume`` without
    a path) and its contents, ``(None, None)`` if there is none; a truncated
    or unreadable newer one is skipped and named."""
    bad = []
    for path in complete_checkpoints(work_dir):
        try:
            checkpoint = read_checkpoint(path)
        except (CheckpointError, FileNotFoundError) as e:
            bad.append((path, e))
            continue
        if bad:
            print(f'The newest checkpoint {bad[0][0]} cannot be read '
                  f'({str(bad[0][1]).splitlines()[0]}); resuming from {path}, '
                  'the newest complete one.', flush=True)
        return path, checkpoint
    if bad:
        raise UserError(
            f'No checkpoint in {work_dir} can be resumed: '
            + '; '.join(f'{p} ({str(e).splitlines()[0]})' for p, e in bad))
    return None, None


def adapt_to_machine(cfg) -> None:
    """Fit a GPU recipe to a machine without one, saying what changed."""
    if torch.cuda.is_available():
        return
    notes = []
    wrapper = cfg.get('optim_wrapper') or {}
    if wrapper.get('type') == 'AmpOptimWrapper':
        wrapper['type'] = 'OptimWrapper'
        wrapper.pop('loss_scale', None)
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
    add_required_hooks(cfg)
    maybe_init_cpu_distributed(cfg)
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    return Runner.from_cfg(cfg) if 'runner_type' not in cfg else \
        RUNNERS.build(cfg)


def init_inference_model(cfg, checkpoint: Optional[str],
                         device: str = 'cpu'):
    """The config's detector or segmentor as mmdet's ``init_detector`` /
    mmseg's ``init_model`` build it, in eval mode on ``device``, with the
    weights of ``checkpoint`` (a local file: ours or published) loaded
    strictly, or the config's own initialisation when it is ``None``
    (SyncBN as BatchNorm on the CPU). Class
    names and palette come from the checkpoint, else from the config's test
    dataset."""
    import warnings

    from .checkpoint.published import load_model_checkpoint
    scope = cfg.get('default_scope')
    if scope == 'mmdet':
        from mmdet.apis import init_detector as init
    elif scope == 'mmseg':
        from mmseg.apis import init_model as init
    else:
        raise UserError(f'The config has default_scope={scope!r}; tools of '
                        'this project take mmdet or mmseg configs.')
    backbone = cfg.model.get('backbone') or {}
    if checkpoint is not None and backbone.get('init_cfg'):
        backbone.init_cfg = None  # the weights come from the checkpoint
    with warnings.catch_warnings():  # "checkpoint is None": loaded below
        warnings.simplefilter('ignore')
        model = init(cfg, None, device='cpu')
    dataset_meta = load_model_checkpoint(model, checkpoint) \
        if checkpoint is not None else {}
    if not dataset_meta.get('classes'):
        dataset = cfg.get('test_dataloader', {}).get('dataset', {})
        if dataset.get('metainfo', {}).get('classes'):
            dataset_meta = dict(dataset.metainfo)
        else:
            dataset_meta = dict(getattr(model, 'dataset_meta', None) or {})
    model.dataset_meta = dataset_meta
    if torch.device(device).type == 'cpu':  # SyncBN needs GPUs
        from mmengine.model import revert_sync_batchnorm
        model = revert_sync_batchnorm(model)
    return model.to(device).eval()


def run_cli(main) -> None:
    """Run a tool's ``main``; bad input ends it with one paragraph."""
    try:
        main()
    except XCiTDenseError as e:
        fail(e)


def finish_distributed() -> None:
    """Leave the process group cleanly (gloo may abort at interpreter exit
    otherwise)."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


__all__ = [
    'UserError', 'add_required_hooks', 'add_run_arguments',
    'checkpoint_to_resume', 'adapt_to_machine', 'build_runner',
    'check_checkpoint', 'check_inputs', 'config_from_args', 'fail',
    'finish_distributed', 'init_inference_model', 'load_config',
    'maybe_init_cpu_distributed',
    'run_cli'
]
