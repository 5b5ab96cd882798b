"""Train a detector or segmentor with an mmdet or mmseg config.

One script for both toolkits: the config's ``default_scope`` (``mmdet`` or
``mmseg``) decides which registries build the model, datasets and metrics.
Arguments are those of mmdet's and mmseg's ``tools/train.py``.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from xcit_dense.cli import (  # noqa: E402
    add_run_arguments,
    config_from_args,
    run_cli,
)
from xcit_dense.errors import UserError  # noqa: E402
from xcit_dense.launch import EXIT_PREEMPTED  # noqa: E402
from xcit_dense.preflight import check_inputs  # noqa: E402
from xcit_dense.runner import (  # noqa: E402
    build_runner,
    finish_distributed,
    use_amp,
)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config', help='train config file path')
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
    add_run_arguments(parser)
    return parser.parse_args()


def main():
    args = parse_args()
    cfg = config_from_args(args)

    if args.amp:
        use_amp(cfg)

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
        # check_inputs picks the newest complete checkpoint of the work dir
        # (a truncated newer one is skipped and named); none: start afresh
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume

    check_inputs(cfg, training=True)
    runner = build_runner(cfg)
    runner.train()
    preempted = runner.message_hub.get_info('preempted')
    del runner  # its DDP model lets go of the process group before it ends
    finish_distributed()
    if preempted:
        sys.exit(EXIT_PREEMPTED)  # checkpointed on a signal: resume later


if __name__ == '__main__':
    run_cli(main)
