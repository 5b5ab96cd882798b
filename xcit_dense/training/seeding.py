"""Random numbers that depend only on the position in the run.

Everything random in training (augmentation in the dataloader workers or the
main process; dropout, drop path and the detector's samplers in the model)
draws from the Python, NumPy and torch streams of the process that runs it.
Seeding those streams from the run's seed and the position (the sample's
epoch, batch and slot; the iteration, with the rank) right before each
sample is loaded and each iteration runs makes every draw a function of the
position alone: a run resumed at any iteration, with fresh processes, draws
what the uninterrupted run drew, with nothing to save or restore.
"""
import random

import numpy as np
import torch

SAMPLE, ITERATION = 0, 1  # kinds of position


def position_seed(seed: int, rank: int, kind: int, *position: int) -> int:
    """A 32-bit seed for one position of the run."""
    return int(np.random.SeedSequence(
        [seed % 2**32, rank, kind, *position]).generate_state(1)[0])


def seed_everything(seed: int) -> None:
    """Seed the Python, NumPy and torch (CPU and GPU) streams."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
