"""Tensors derived from a module's weights (a BatchNorm folded into a
convolution, weights cast to autocast's dtype), kept across inference calls
while the weights stay as they are; in training, weights cast to autocast's
dtype together."""
import math
import weakref
from typing import (
    Callable,
    Dict,
    Hashable,
    List,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
)

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


def autocast_weights(owner: nn.Module, slot: Hashable,
                     layers: Sequence[nn.Linear], dtype: torch.dtype
                     ) -> List[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """Each of ``layers``' weight and bias in ``dtype`` (autocast's, as
    autocast casts them for every call of a linear layer). In inference
    :func:`kept` in ``owner`` under ``slot``: a call under autocast then
    launches no casts of them. Where autograd records, cast together
    (:class:`_CastTogether`): one copy and one cast each way for all of
    them, where autocast launches a cast per tensor each way."""
    tensors = [t for layer in layers for t in (layer.weight, layer.bias)]
    present = [t for t in tensors if t is not None]
    if all(t.dtype == dtype for t in present):
        cast = tensors
    elif torch.is_grad_enabled() and len({t.dtype for t in present}) == 1 \
            and any(t.requires_grad for t in present):
        together = iter(_CastTogether.apply(dtype, *present))
        cast = [None if t is None else next(together) for t in tensors]
    else:
        cast = kept(owner, slot, lambda: [
            None if t is None else t.to(dtype) for t in tensors],
            *layers, *tensors, dtype)
    return [(cast[i], cast[i + 1]) for i in range(0, len(cast), 2)]


class _CastTogether(torch.autograd.Function):
    """Tensors of one dtype -> the same in ``dtype``, as ``t.to(dtype)``
    each, forward and backward, in two launches each way (one copy into a
    flat buffer, one cast of it) whatever their number; the results, and
    the gradients, are views of one buffer."""

    @staticmethod
    def forward(ctx, dtype: torch.dtype, *tensors: torch.Tensor):
        ctx.source = tensors[0].dtype
        ctx.shapes = [t.shape for t in tensors]
        flat = torch.cat([t.reshape(-1) for t in tensors]).to(dtype)
        return _views(flat, ctx.shapes)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        # (autograd hands zeros for a result that got no gradient)
        flat = torch.cat([g.reshape(-1) for g in grads]).to(ctx.source)
        return (None, *_views(flat, ctx.shapes))


def _views(flat: torch.Tensor, shapes) -> Tuple[torch.Tensor, ...]:
    """``flat`` as consecutive tensors of ``shapes``."""
    sizes = [math.prod(shape) for shape in shapes]
    return tuple(part.view(shape)
                 for part, shape in zip(flat.split(sizes), shapes))
