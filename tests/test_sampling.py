"""ResumableBatchSampler (xcit_dense/training/sampling.py) around mmdet's
AspectRatioBatchSampler, whose instance keeps part-filled buckets: a pass
that stops early (a dataloader's prefetch, then a fresh iterator, as the
resumable loops do) leaves nothing to the next pass."""
import itertools

import pytest
from mmengine.dataset import DefaultSampler

from xcit_dense.training.sampling import InfiniteSampler, ResumableBatchSampler


class Images:
    """Data infos of 10 images, portrait and landscape by turns."""

    def __len__(self):
        return 10

    def get_data_info(self, idx):
        return dict(width=64 + 32 * (idx % 2), height=80)


class Endless(InfiniteSampler):
    """The endless sampler, failing where a pass would run forever."""

    def __iter__(self):
        for drawn, index in enumerate(super().__iter__()):
            assert drawn < 100, 'a pass drew 100 indices and yielded no batch'
            yield index


def batches(sampler, count=None):
    """The batches of one pass, as lists of plain indices."""
    return [[int(k) for k in b] for b in itertools.islice(sampler, count)]


@pytest.mark.parametrize('sampler', [DefaultSampler, Endless])
def test_a_pass_stopped_early_leaves_nothing_to_the_next(sampler):
    def resumable():
        return ResumableBatchSampler(
            sampler(Images(), shuffle=True, seed=3), 2,
            batch_sampler=dict(type='mmdet.AspectRatioBatchSampler'))

    fresh = batches(resumable(), 6)
    assert all(len({i % 2 for i in b}) == 1 for b in fresh[:4])  # grouped
    reused = resumable()
    assert batches(reused, 2) == fresh[:2]  # stopped after two batches
    assert batches(reused, 6) == fresh  # the next pass from its start
    if sampler is DefaultSampler:
        assert len(batches(reused)) == len(reused) == 5
