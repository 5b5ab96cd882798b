"""Data order and augmentation that depend only on the position in the run
(see :mod:`.seeding`).

Each sample drawn for training gets a seed computed from the run's seed, the
rank, the sampler's epoch, the batch number in that epoch and its slot in the
batch
(:class:`SampleKey`); :class:`SeededSamples` seeds Python, NumPy and torch
with it right before the dataset's pipeline runs, in whichever process loads
it. Random augmentation is then a function of the position alone, not of how
many samples a dataloader worker has processed before, so a resumed run can
start in the middle of an epoch with fresh workers and load the same data as
the uninterrupted run. :class:`ResumableBatchSampler` (around any sampler
and batch sampler, e.g. mmdet's ``AspectRatioBatchSampler``) attaches the
keys and marks the batches a resumed run skips, which are then not loaded.
"""
from typing import Iterator, List, Optional

from mmengine.dataset import InfiniteSampler as MMEngineInfiniteSampler
from torch.utils.data import BatchSampler, Dataset, Sampler

from ..registry import DATA_SAMPLERS
from .seeding import SAMPLE, position_seed, seed_everything


class SampleKey(int):
    """A dataset index carrying the seed of its augmentation and whether the
    batch it belongs to is skipped."""

    def __new__(cls, index: int, seed: int, skip: bool = False):
        key = super().__new__(cls, index)
        key.seed, key.skip = seed, skip
        return key

    def __reduce__(self):  # sent to dataloader workers
        return SampleKey, (int(self), self.seed, self.skip)


class SeededSamples(Dataset):
    """A dataset whose items are loaded with the random streams seeded by
    their :class:`SampleKey` (plain indices load as the dataset does);
    skipped keys load nothing (``None``). Everything else is the wrapped
    dataset's (``metainfo``, ``get_data_info``, ...)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        if isinstance(key, SampleKey):
            if key.skip:
                return None
            seed_everything(key.seed)
        return self.dataset[int(key)]

    def get_data_info(self, idx):
        return self.dataset.get_data_info(int(idx))

    def __getattr__(self, name):
        if name == 'dataset':  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.dataset, name)


@DATA_SAMPLERS.register_module()
class ResumableBatchSampler(Sampler):
    """Batches of :class:`SampleKey` from a sampler and batch sampler.

    Args:
        sampler: the sampler (mmengine's ``DefaultSampler``,
            ``InfiniteSampler``, ...), given by mmengine's
            ``build_dataloader``.
        batch_size (int): samples per batch.
        batch_sampler (dict, optional): the batch sampler to wrap (e.g.
            mmdet's ``AspectRatioBatchSampler``); default torch's
            ``BatchSampler``.
        drop_last (bool): for the default batch sampler.
        seed (int): the run's seed. rank (int): this process's rank.
    """

    def __init__(self, sampler, batch_size: int,
                 batch_sampler: Optional[dict] = None,
                 drop_last: bool = False, seed: int = 0, rank: int = 0):
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.batch_sampler_cfg = batch_sampler
        self.seed, self.rank = seed, rank
        self._skip = 0  # batches of the next pass to skip
        self._epoch = None  # the last set_epoch, for a new batch sampler
        self.batch_sampler = self._new_batch_sampler()

    def _new_batch_sampler(self):
        """The batch sampler of one pass over the sampler, built anew for
        each pass. mmdet's ``AspectRatioBatchSampler`` keeps its part-filled
        buckets in the instance, and the batch it yielded last until its
        next step: a pass that stopped early (the prefetch of a dataloader
        iterator replaced by a fresh one, as the resumable loops replace
        mmengine's first) would hand them to the next pass, which then
        repeats a batch, or, on an endless sampler, never yields."""
        if self.batch_sampler_cfg is None:
            batch_sampler = BatchSampler(self.sampler, self.batch_size,
                                         self.drop_last)
        else:
            batch_sampler = DATA_SAMPLERS.build(
                self.batch_sampler_cfg,
                default_args=dict(sampler=self.sampler,
                                  batch_size=self.batch_size))
        if self._epoch is not None and hasattr(batch_sampler, 'set_epoch'):
            batch_sampler.set_epoch(self._epoch)
        return batch_sampler

    @property
    def epoch(self) -> int:
        """The sampler's epoch (mmengine's loops and hooks set it)."""
        return getattr(self.sampler, 'epoch', 0)

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        if hasattr(self.batch_sampler, 'set_epoch'):
            self.batch_sampler.set_epoch(epoch)
        elif hasattr(self.sampler, 'set_epoch'):
            self.sampler.set_epoch(epoch)

    def skip(self, num_batches: int) -> None:
        """Mark the next ``num_batches`` batches as skipped (not loaded)."""
        self._skip = num_batches

    def __iter__(self) -> Iterator[List[SampleKey]]:
        epoch = self.epoch
        self.batch_sampler = self._new_batch_sampler()
        for batch, indices in enumerate(self.batch_sampler):
            skip = self._skip > 0
            self._skip -= skip
            yield [SampleKey(index, position_seed(self.seed, self.rank,
                                                  SAMPLE, epoch, batch, slot),
                             skip)
                   for slot, index in enumerate(indices)]

    def __len__(self) -> int:
        return len(self.batch_sampler)


@DATA_SAMPLERS.register_module()
class InfiniteSampler(MMEngineInfiniteSampler):
    """mmengine's ``InfiniteSampler`` whose every iteration starts from the
    beginning of its (seeded) index stream, as ``DefaultSampler`` does per
    epoch; mmengine's continues where an earlier iterator stopped, so the
    data order would depend on how many iterators were made."""

    def __iter__(self):
        yield from self._indices_of_rank()
