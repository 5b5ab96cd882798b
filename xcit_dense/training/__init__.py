"""Training that can be interrupted at any moment and resumed to the same
result: randomness seeded by the position in the run, resumable loops and
sampling, atomic checkpoint files (the pre-emption hook is in
:mod:`xcit_dense.hooks`)."""
from .file_backend import AtomicLocalBackend
from .loops import EpochBasedTrainLoop, IterBasedTrainLoop
from .sampling import (
    InfiniteSampler,
    ResumableBatchSampler,
    SampleKey,
    SeededSamples,
)

__all__ = [
    'AtomicLocalBackend', 'EpochBasedTrainLoop', 'InfiniteSampler',
    'IterBasedTrainLoop', 'ResumableBatchSampler', 'SampleKey',
    'SeededSamples'
]
