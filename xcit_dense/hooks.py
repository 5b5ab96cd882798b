"""Runner hooks of the ``xcit_dense`` scope."""
import os.path as osp
import signal as signals
from typing import Optional

import torch
from mmengine.dist import all_reduce, barrier
from mmengine.hooks import Hook
from mmengine.logging import print_log

from .checkpoint.published import is_published, model_weights, refuse_resume
from .launch import EXIT_PREEMPTED
from .optim import merge_saved_schedulers
from .registry import HOOKS
from .training import AtomicLocalBackend
from .training.workers import tolerate_stop_signal


@HOOKS.register_module()
class CheckpointImportHook(Hook):
    """Loads whole-model checkpoints (``tools/test.py``, ``load_from``) the
    way this package loads backbones: published layouts converted in memory,
    every key checked.

    On mmengine's ``after_load_checkpoint`` (called by
    ``Runner.load_checkpoint`` and ``Runner.resume`` with the checkpoint
    just read), a checkpoint in the layout of the published XCiT detectors
    and segmentors (mmdet 2.11 / mmseg 0.11) is converted to ours, each
    change logged, and compared with the model strictly: a missing,
    unexpected or differently shaped weight is an error naming the keys.
    Loading with ``load_from`` (fine-tuning) may change the number of
    classes: the class-dependent output layers that differ in shape are then
    left freshly initialised and named in the log. Resuming from a published
    checkpoint is refused (it holds no optimizer state of ours). A resumed
    checkpoint whose optimizer state has one group per parameter, where the
    runner's optimizer has them merged (``NoDecayOptimWrapperConstructor``),
    has its schedulers' per-group values merged alike (the optimizer's own
    state merges as it loads). Whether the runner resumes or fine-tunes is
    read from its config (``resume``, ``load_from``), as ``Runner.from_cfg``
    builds it.

    Args:
        allow_new_classes (bool, optional): whether the class-dependent
            layers may differ in shape from the checkpoint's (fine-tuning).
            None: as the config says (``load_from`` without ``resume``);
            ``tools/test.py`` sets False (the model tested is the one
            trained, every weight loaded).
    """

    priority = 'VERY_HIGH'

    def __init__(self, allow_new_classes: Optional[bool] = None) -> None:
        self.allow_new_classes = allow_new_classes

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        resume = bool(runner.cfg.get('resume'))
        allow_new_classes = self.allow_new_classes
        if allow_new_classes is None:
            allow_new_classes = not resume and \
                runner.cfg.get('load_from') is not None
        if resume and is_published(checkpoint):
            refuse_resume(runner.cfg.get('load_from') or 'the checkpoint')
        optimizer = getattr(runner.optim_wrapper, 'optimizer', None)
        if resume and isinstance(optimizer, torch.optim.Optimizer):
            merge_saved_schedulers(checkpoint, optimizer)
        model = runner.model
        while hasattr(model, 'module'):  # DDP, test-time augmentation
            model = model.module
        converted, weights, reinit = model_weights(
            checkpoint, model.state_dict(),
            allow_new_classes=allow_new_classes,
            log=lambda msg: print_log(msg, logger='current'))
        if converted is not checkpoint:  # a published one, converted
            checkpoint.clear()
            checkpoint.update(converted)
        if reinit:
            print_log(
                'Fine-tuning to other classes: the class-dependent layers '
                f'{", ".join(reinit)} differ in shape from the checkpoint '
                'and stay freshly initialised.', logger='current')
        if 'state_dict' in checkpoint:
            checkpoint['state_dict'] = weights
        else:
            checkpoint.clear()
            checkpoint.update(weights)


@HOOKS.register_module()
class PreemptionHook(Hook):
    """On SIGTERM, SIGINT or the pre-emption signal, finish the iteration in
    flight, save a checkpoint of exactly that point and stop.

    Schedulers send SIGTERM before killing a job; SLURM sends ``signal``
    some time before the end of a job's time (``--signal``). The handler
    only takes note; after the iteration, all ranks agree (the signal may
    reach them at different iterations) and rank 0 writes
    ``iter_<n>.pth`` (atomically, then ``last_checkpoint``), the loop stops,
    and ``tools/train.py`` exits with status 75 (:data:`EXIT_PREEMPTED`). A
    second SIGINT interrupts at once, as usual.

    Args:
        signal (str): the pre-emption signal besides SIGTERM and SIGINT.
            Defaults to ``'SIGUSR1'``.
    """

    priority = 'LOWEST'  # after the iteration's other hooks and checkpoint

    def __init__(self, signal: str = 'SIGUSR1'):
        names = {'SIGTERM', 'SIGINT', signal}
        unknown = [n for n in names if not hasattr(signals, str(n))]
        if unknown:
            raise ValueError(f'PreemptionHook: unknown signal {unknown[0]!r}'
                             ' (use a name such as SIGUSR1, SIGUSR2)')
        self.signals = sorted(getattr(signals, n) for n in names)
        self.received = None
        self._previous = {}

    def _note(self, signum, frame):
        self.received = signum
        if signum == signals.SIGINT:  # a second Ctrl-C interrupts at once
            signals.signal(signals.SIGINT, self._previous.get(
                signals.SIGINT, signals.default_int_handler))

    def before_train(self, runner) -> None:
        for signum in self.signals:
            self._previous[signum] = signals.signal(signum, self._note)
        # a SIGTERM sent to every process of the job must not end the
        # dataloader workers the iteration in flight needs: those started
        # from now on (validation's; the training loaders of this package's
        # loops have theirs so from the start)
        for loop in (runner.train_loop, runner.val_loop):
            if loop is not None:
                tolerate_stop_signal(getattr(loop, 'dataloader', None))

    def after_train(self, runner) -> None:
        for signum, handler in self._previous.items():
            signals.signal(signum, handler)
        self._previous.clear()

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        # every rank learns the signal any rank received
        flag = torch.tensor([self.received or 0], dtype=torch.int64)
        all_reduce(flag, op='max')
        received = int(flag)
        if not received:
            return
        name = signals.Signals(received).name
        filename = f'iter_{runner.iter + 1}.pth'
        runner.save_checkpoint(
            runner.work_dir, filename, save_optimizer=True,
            save_param_scheduler=True, by_epoch=False,
            backend_args=dict(backend='atomic_local'))
        path = osp.join(runner.work_dir, filename)
        if runner.rank == 0:
            AtomicLocalBackend().put_text(
                path, osp.join(runner.work_dir, 'last_checkpoint'))
        barrier()  # no rank exits while rank 0 writes
        runner.message_hub.update_info('preempted', name)
        runner.train_loop.stop_training = True
        print_log(f'{name} received: saved the state after iteration '
                  f'{runner.iter + 1} to {path} and stopping (exit status '
                  f'{EXIT_PREEMPTED}); continue with --resume.',
                  logger='current')
