"""Let mmengine resume its own checkpoints under ``weights_only=True``.

torch >= 2.6 loads with ``weights_only=True`` by default, and mmengine 0.10
calls ``torch.load`` without the argument, so resuming a checkpoint that
mmengine itself saved fails on the few non-tensor types its message hub
stores: ``HistoryBuffer`` objects holding numpy arrays and scalars, whose
statistics methods are pickled as ``getattr(HistoryBuffer, 'min')``. Rather
than turning ``weights_only`` off for every file, exactly those types are
allow-listed, and ``getattr`` only in a form that resolves HistoryBuffer's
statistics methods and nothing else.
"""
import pickle
from typing import Callable, List

import numpy as np
import torch
from mmengine.logging import HistoryBuffer


def history_buffer_method(owner: type, name: str) -> Callable:
    """The ``getattr`` seen by the unpickler: resolves a registered
    statistics method of ``HistoryBuffer`` and refuses anything else."""
    if owner is HistoryBuffer and isinstance(name, str):
        method = getattr(HistoryBuffer, name, None)
        if method is not None and (
                name in ('min', 'max', 'current', 'mean')
                or method in HistoryBuffer._statistics_methods.values()):
            return method
    raise pickle.UnpicklingError(
        f'getattr({owner!r}, {name!r}) is not allowed when loading with '
        'weights_only=True (only HistoryBuffer statistics methods are)')


def mmengine_checkpoint_types() -> List[object]:
    """The non-tensor types found in checkpoints that mmengine saves."""
    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    dtypes = {type(np.dtype(t)) for t in (
        np.float64, np.float32, np.float16, np.int64, np.int32, np.uint8,
        np.bool_)}
    return [HistoryBuffer, np.ndarray, np.dtype, _reconstruct, scalar,
            *sorted(dtypes, key=lambda t: t.__name__),
            (history_buffer_method, 'builtins.getattr')]


def register_mmengine_safe_globals() -> None:
    """Allow-list :func:`mmengine_checkpoint_types` for ``torch.load``."""
    torch.serialization.add_safe_globals(mmengine_checkpoint_types())
