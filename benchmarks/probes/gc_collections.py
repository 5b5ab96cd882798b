"""CPython's garbage collections in a process of the package: while it
imports the package, and per iteration of a config's training as
``tools/train.py`` runs it (``run_cli``, ``build_runner``).

The collections are timed by ``gc.callbacks``, by generation (0 and 1:
the young objects; 2: a full collection, which walks every object the
process holds); the iterations are those after ``--skip`` (the first ones
build the data loader's iterator, cache and warm up). ``--no-freeze``
runs the training without ``run_cli``'s ``gc.freeze``, to compare::

    python -m benchmarks.probes.collections CONFIG [--iters 45] [--skip 5]
        [--work-dir DIR] [--no-freeze] [--cfg-options KEY=VALUE ...]

CONFIG: an iteration-based training (the demos, the ADE20K recipes).
Prints the import's collections, then one line for the iterations.
"""
import gc
import time


class Collections:
    """The collections from its making to :meth:`stop`: count and seconds
    by generation."""

    def __init__(self) -> None:
        self.started = (0.0, 0)
        self.by_generation = {g: [0, 0.0] for g in range(3)}
        gc.callbacks.append(self)

    def stop(self) -> None:
        gc.callbacks.remove(self)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == 'start':
            self.started = (time.perf_counter(), info['generation'])
        else:
            start, generation = self.started
            counted = self.by_generation[generation]
            counted[0] += 1
            counted[1] += time.perf_counter() - start

    def line(self, per: int = 1, unit: str = '') -> str:
        return ', '.join(
            f'generation {g}: {n / per:.2f}{unit} in {1e3 * s / per:.2f} ms'
            for g, (n, s) in self.by_generation.items())


IMPORT = Collections()
_start = time.perf_counter()
import xcit_dense  # noqa: E402,F401

_imported = time.perf_counter() - _start
IMPORT.stop()

# after the import's collections are counted
import argparse  # noqa: E402

from mmengine.config import DictAction  # noqa: E402
from mmengine.hooks import Hook  # noqa: E402

from xcit_dense.cli import load_config, run_cli  # noqa: E402
from xcit_dense.errors import UserError  # noqa: E402
from xcit_dense.runner import build_runner  # noqa: E402


class CollectionsPerIterationHook(Hook):
    """Times the collections of the training's iterations after ``skip``
    and prints them per iteration when the training ends."""

    def __init__(self, skip: int = 5) -> None:
        self.skip, self.collections = skip, None

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter == self.skip:
            self.collections = Collections()
            self.start = time.perf_counter()

    def after_train(self, runner):
        if self.collections is None:
            print(f'fewer than {self.skip} iterations: nothing timed')
            return
        self.collections.stop()
        n = runner.iter - self.skip
        seconds = time.perf_counter() - self.start
        print(f'{n} iterations of {1e3 * seconds / n:.0f} ms, per '
              f'iteration: {self.collections.line(n, " collections")}; '
              f'frozen objects: {gc.get_freeze_count()}')


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config')
    parser.add_argument('--iters', type=int, default=45)
    parser.add_argument('--skip', type=int, default=5)
    parser.add_argument('--work-dir', default='work_dirs/collections')
    parser.add_argument('--no-freeze', action='store_true')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args()


def main():
    args = parse_args()
    print(f'import xcit_dense: {_imported:.2f} s; {IMPORT.line()}')
    if args.no_freeze:
        gc.unfreeze()
    cfg = load_config(args.config, args.cfg_options)
    if 'max_iters' not in cfg.train_cfg:
        raise UserError(
            f'{args.config} trains by epochs; this counts the iterations of '
            'an iteration-based training loop (the demos, the ADE20K '
            'recipes): give one of those')
    cfg.work_dir = args.work_dir
    cfg.train_cfg.update(max_iters=args.iters)
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.default_hooks.logger.interval = args.iters
    cfg.default_hooks.checkpoint.interval = args.iters + 1
    runner = build_runner(cfg)
    runner.register_hook(CollectionsPerIterationHook(args.skip), 'LOWEST')
    runner.train()


if __name__ == '__main__':
    run_cli(main)
