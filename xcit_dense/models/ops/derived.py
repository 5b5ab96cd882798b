"""Tensors derived from a module's weights (a BatchNorm folded into a
convolution, weights cast to autocast's dtype), kept across inference calls
while the weights stay as they are."""
import weakref
from typing import Callable, Dict, Hashable, Optional, Tuple, TypeVar

import torch
import torch.nn as nn

T = TypeVar('T')

#: module -> slot -> (what the derivation read, their versions, its result)
_KEPT: 'weakref.WeakKeyDictionary[nn.Module, Dict[Hashable, tuple]]' = \
    weakref.WeakKeyDictionary()


def kept(owner: nn.Module, slot: Hashable, derive: Callable[[], T],
         *reads: object) -> T:
    """``derive()`` (tensors derived from ``owner``'s weights: a folding, a
    cast), computed once and given again while what it ``reads`` is
    unchanged: the same objects (modules, tensors, settings), each tensor
    at the same version and in the same memory (an in-place update,
    ``load_state_dict`` among them, and new data, ``.to()`` or ``.half()``,
    count as changes). Computed afresh where autograd records, under
    ``torch.compile`` and while a CUDA graph captures (its replays then
    derive them from the weights as they are, in-place updates included).
    On a GPU, where the eager forward is bound by kernel launches, deriving
    them on every call launches more kernels than the work they save."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling() or (
            torch.cuda.is_available() and
            torch.cuda.is_current_stream_capturing()):
        return derive()
    versions = tuple((r._version, r.data_ptr(), r.dtype, r.device)
                     if isinstance(r, torch.Tensor) else None for r in reads)
    slots = _KEPT.setdefault(owner, {})
    entry = slots.get(slot)
    if entry is not None and len(entry[0]) == len(reads) and all(
            a is b for a, b in zip(entry[0], reads)) and entry[1] == versions:
        return entry[2]
    result = derive()
    slots[slot] = (reads, versions, result)
    return result


def autocast_weights(owner: nn.Module, slot: Hashable, layer: nn.Linear,
                     dtype: torch.dtype
                     ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``layer``'s weight and bias in ``dtype`` (autocast's, as autocast
    casts them for every call of a linear layer), :func:`kept` in
    ``owner`` under ``slot``: an inference call under autocast then
    launches no casts of them."""
    weight, bias = layer.weight, layer.bias
    if weight.dtype == dtype:
        return weight, bias
    return kept(owner, slot, lambda: (
        weight.to(dtype), None if bias is None else bias.to(dtype)),
        layer, weight, bias, dtype)
