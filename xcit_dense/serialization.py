"""Let mmengine resume its own checkpoints under ``weights_only=True``.

torch >= 2.6 loads with ``weights_only=True`` by default, and mmengine 0.10
calls ``torch.load`` without the argument, so resuming a checkpoint that
mmengine itself saved fails on the few non-tensor types it stores (the
message hub's ``HistoryBuffer`` and the numpy arrays and scalars inside it).
Rather than turning ``weights_only`` off for every file, those specific types
are allow-listed.
"""
from typing import List

import numpy as np
import torch


def mmengine_checkpoint_types() -> List[object]:
    """The non-tensor types found in checkpoints that mmengine saves."""
    from mmengine.logging import HistoryBuffer
    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    dtypes = {type(np.dtype(t)) for t in (
        np.float64, np.float32, np.float16, np.int64, np.int32, np.uint8,
        np.bool_)}
    return [HistoryBuffer, np.ndarray, np.dtype, _reconstruct, scalar,
            *sorted(dtypes, key=lambda t: t.__name__)]


def register_mmengine_safe_globals() -> None:
    """Allow-list :func:`mmengine_checkpoint_types` for ``torch.load``."""
    torch.serialization.add_safe_globals(mmengine_checkpoint_types())
