"""Train a detector or segmentor with an mmdet or mmseg config.

One script for both toolkits: the config's ``default_scope`` (``mmdet`` or
``mmseg``) decides which registries build the model, datasets and metrics.
Arguments are those of mmdet's and mmseg's ``tools/train.py``.
"""
import argparse
import os
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmengine.config import DictAction  # noqa: E402

from xcit_dense.checkpoint import CheckpointError  # noqa: E402
from xcit_dense.transforms import DataError  # noqa: E402
from xcit_dense.launch import (UserError, adapt_to_machine,  # noqa: E402
                               check_inputs, fail, finish_distributed,
                               load_config, maybe_init_cpu_distributed)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--amp', action='store_true', default=False,
        help='enable automatic-mixed-precision training')
    parser.add_argument(
        '--auto-scale-lr', action='store_true',
        help='scale the learning rate to the total batch size')
    parser.add_argument(
        '--resume', nargs='?', type=str, const='auto',
        help='resume from the given checkpoint, or, without a path, from '
        'the latest checkpoint in the work dir')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction, default={},
        help='override settings in the config, key=value, e.g. '
        'model.backbone.init_cfg.checkpoint=pretrained/xcit.pth')
    parser.add_argument(
        '--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none', help='job launcher')
    # torch.distributed.launch passes --local-rank / --local_rank
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args()
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def main():
    args = parse_args()
    cfg = load_config(args.config, args.cfg_options)
    cfg.launcher = args.launcher

    # work_dir: command line > config > ./work_dirs/<config name>
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])

    if args.amp:
        wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
        if wrapper == 'AmpOptimWrapper':
            print('AMP training is already enabled in your config.')
        else:
            assert wrapper == 'OptimWrapper', (
                '`--amp` is only supported when the optimizer wrapper type '
                f'is `OptimWrapper` but got {wrapper}.')
            cfg.optim_wrapper.type = 'AmpOptimWrapper'
            cfg.optim_wrapper.loss_scale = 'dynamic'

    if args.auto_scale_lr:
        if 'auto_scale_lr' in cfg and 'enable' in cfg.auto_scale_lr and \
                'base_batch_size' in cfg.auto_scale_lr:
            cfg.auto_scale_lr.enable = True
        else:
            raise UserError('Can not find "auto_scale_lr" or '
                            '"auto_scale_lr.enable" or '
                            '"auto_scale_lr.base_batch_size" in your '
                            'configuration file.')

    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume

    check_inputs(cfg, training=True)
    adapt_to_machine(cfg)
    maybe_init_cpu_distributed(cfg)

    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    if 'runner_type' not in cfg:
        runner = Runner.from_cfg(cfg)
    else:
        runner = RUNNERS.build(cfg)
    runner.train()
    finish_distributed()


if __name__ == '__main__':
    try:
        main()
    except (UserError, CheckpointError, DataError) as e:
        fail(e)
