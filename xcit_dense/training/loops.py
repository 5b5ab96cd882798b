"""mmengine's training loops, resumable at any iteration to the same result.

What the uninterrupted run computes after iteration ``k`` depends on the
model's state (checkpointed by mmengine), the data it loads next and the
random numbers it draws. These loops make the last two a function of the
position in the run (:mod:`.seeding`):

* data: the dataloader is built with :class:`~.sampling.SeededSamples` and
  :class:`~.sampling.ResumableBatchSampler` (augmentation seeded per sample;
  a resumed run skips the batches already trained on without loading them,
  also in the middle of an epoch);
* the model's random numbers (dropout, drop path, the detector's samplers):
  the process's streams are seeded from the run's seed, the rank and the
  iteration before each iteration.

Mid-epoch checkpoints (``by_epoch=False``, or a pre-emption checkpoint)
resume in the middle of the epoch. Use them as
``train_cfg = dict(type='xcit_dense.IterBasedTrainLoop', ...)`` or
``dict(type='xcit_dense.EpochBasedTrainLoop', ...)``; the arguments are
mmengine's.
"""
import copy
import logging

from mmengine.dist import get_rank
from mmengine.logging import print_log
from mmengine.registry import DATASETS
from mmengine.runner import EpochBasedTrainLoop as MMEngineEpochLoop
from mmengine.runner import IterBasedTrainLoop as MMEngineIterLoop

from ..registry import LOOPS
from ..toolkits import type_name
from .sampling import SeededSamples
from .seeding import ITERATION, position_seed, seed_everything
from .workers import tolerate_stop_signal

#: the message hub's record of the epoch in progress: [epoch, the iteration
#: it began after, its length in iterations]
EPOCH_STARTED = 'xcit_dense.epoch_started'


def resumable_dataloader(runner, dataloader):
    """The training DataLoader, built from its config as mmengine's loops
    build it, with seeded samples and resumable batches, and workers that
    outlive a SIGTERM sent to the whole job (:mod:`.workers`: set before
    the loader's first iterator, which mmengine's iteration loop creates in
    its constructor, so persistent workers start with it)."""
    if not isinstance(dataloader, dict):
        raise TypeError(
            'The resumable training loops build their dataloader from a '
            f'config dict; got {type(dataloader).__name__}.')
    cfg = copy.deepcopy(dataloader)
    dataset = cfg['dataset']
    if isinstance(dataset, dict):
        dataset = DATASETS.build(dataset)
        if hasattr(dataset, 'full_init'):
            dataset.full_init()
    cfg['dataset'] = SeededSamples(dataset)
    sampler = cfg.get('sampler') or {}
    if type_name(sampler) == 'InfiniteSampler':
        cfg['sampler'] = dict(sampler, type='xcit_dense.InfiniteSampler')
    cfg['batch_sampler'] = dict(
        type='xcit_dense.ResumableBatchSampler',
        batch_sampler=cfg.get('batch_sampler'),
        drop_last=cfg.pop('drop_last', False),
        seed=runner.seed or 0, rank=get_rank())
    loader = runner.build_dataloader(
        cfg, seed=runner.seed,
        diff_rank_seed=runner._randomness_cfg.get('diff_rank_seed', False))
    tolerate_stop_signal(loader)
    return loader


class _Resumable:
    """What both loops share: each iteration seeded by its position."""

    def _seed_iteration(self) -> None:
        seed_everything(position_seed(self.runner.seed or 0, get_rank(),
                                      ITERATION, self._iter))

    def _iterate_from(self, done: int, make_iterator):
        """A fresh iterator over the dataloader (``make_iterator``), past the
        first ``done`` batches, which are flagged and not loaded."""
        self.dataloader.batch_sampler.skip(done)
        iterator = make_iterator(self.dataloader)
        for _ in range(done):
            next(iterator)
        return iterator

    def _validate_if_due(self, count: int, last: int) -> None:
        """mmengine's validation schedule, after ``count`` iterations (or
        epochs) of ``last``."""
        if (self.runner.val_loop is not None and count >= self.val_begin
                and (count % self.val_interval == 0 or count == last)):
            self.runner.val_loop.run()


@LOOPS.register_module()
class IterBasedTrainLoop(_Resumable, MMEngineIterLoop):
    """mmengine's ``IterBasedTrainLoop``, resumable at any iteration to the
    same result (see the module)."""

    def __init__(self, runner, dataloader, max_iters: int, **kwargs):
        super().__init__(runner, resumable_dataloader(runner, dataloader),
                         max_iters, **kwargs)

    def run(self):
        self.runner.call_hook('before_train')
        self.runner.call_hook('before_train_epoch')
        # A fresh iterator, so that the data order starts from the beginning
        # of the sampler's stream; a resumed run skips what was trained.
        self.dataloader_iterator = self._iterate_from(
            self._iter, type(self.dataloader_iterator))
        while self._iter < self._max_iters and not self.stop_training:
            self.runner.model.train()
            data_batch = next(self.dataloader_iterator)
            self._seed_iteration()
            self.run_iter(data_batch)
            self._decide_current_val_interval()
            self._validate_if_due(self._iter, self._max_iters)
        self.runner.call_hook('after_train_epoch')
        self.runner.call_hook('after_train')
        return self.runner.model


@LOOPS.register_module()
class EpochBasedTrainLoop(_Resumable, MMEngineEpochLoop):
    """mmengine's ``EpochBasedTrainLoop``, resumable at any iteration, also
    in the middle of an epoch, to the same result (see the module). A stop
    requested during an epoch (``stop_training``, e.g. on a pre-emption
    signal) takes effect after the iteration in flight."""

    def __init__(self, runner, dataloader, max_epochs: int, **kwargs):
        super().__init__(runner, resumable_dataloader(runner, dataloader),
                         max_epochs, **kwargs)

    def run(self):
        self.runner.call_hook('before_train')
        while self._epoch < self._max_epochs and not self.stop_training:
            if not self.run_epoch():
                break
            self._decide_current_val_interval()
            self._validate_if_due(self._epoch, self._max_epochs)
        self.runner.call_hook('after_train')
        return self.runner.model

    def run_epoch(self) -> bool:
        """Iterate (the rest of) one epoch; False if stopped within it."""
        self.runner.call_hook('before_train_epoch')
        self.runner.model.train()
        self.dataloader.batch_sampler.set_epoch(self._epoch)
        done = self._done_in_epoch(len(self.dataloader))
        # where this epoch began and its length, in the checkpoints (the
        # message hub's runtime information is saved and resumed with them)
        hub = self.runner.message_hub
        hub.update_info(EPOCH_STARTED, [self._epoch, self._iter - done,
                                        len(self.dataloader)])
        iterator = self._iterate_from(done, iter)
        for idx in range(done, len(self.dataloader)):
            data_batch = next(iterator)
            self._seed_iteration()
            self.run_iter(idx, data_batch)
            if self.stop_training:
                return False
        self.runner.call_hook('after_train_epoch')
        self._epoch += 1
        return True

    def _done_in_epoch(self, length: int) -> int:
        """The iterations of this epoch already trained (a resumed run's;
        0 for an epoch that starts). With the epoch's length as it was
        saved (the number of processes and the batch size those of the
        run that saved it), exactly where it stopped; with another length,
        after about the same share of the epoch's samples, said in the
        log (the data order then is not the uninterrupted run's: the
        samples are split into other batches)."""
        started = self.runner.message_hub.get_info(EPOCH_STARTED)
        if started is None:  # a run that starts, or a checkpoint saved
            # before epochs were recorded (all of one length)
            done = self._iter - self._epoch * length
            return done if 0 <= done < length else 0
        if started[0] != self._epoch:  # the epoch recorded has ended
            return 0
        _, start, saved_length = started
        done = self._iter - start
        if saved_length == length:
            return done
        if done >= saved_length:  # saved at its end: it ends here too
            return length
        resumed = done * length // saved_length
        print_log(
            f'Resuming epoch {self._epoch + 1} after iteration {done} of '
            f'{saved_length}, and this run\'s epoch has {length} iterations '
            f'(the number of processes or the batch size changed): it '
            f'continues after iteration {resumed} of {length}, about the '
            f'same share of the epoch\'s samples, not in the uninterrupted '
            f'run\'s data order.', logger='current', level=logging.WARNING)
        return resumed
