"""The linear layers' weights in autocast's dtype, cast together.

Cast on every call from the weights as they are (as autocast casts them for
each call of a linear layer): a weight written in any way, through
``.data`` too (mmengine's ``EMAHook`` and mmdet's ``MeanTeacherHook``
write theirs so, which no version counter records), is read by the next
call."""
import math
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn


def autocast_weights(layers: Sequence[nn.Linear], dtype: torch.dtype
                     ) -> List[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """Each of ``layers``' weight and bias in ``dtype`` (autocast's, as
    autocast casts them for every call of a linear layer), cast together
    where they share a dtype (:class:`_CastTogether`): one copy and one
    cast each way for all of them, where autocast launches a cast per
    tensor each way."""
    tensors = [t for layer in layers for t in (layer.weight, layer.bias)]
    present = [t for t in tensors if t is not None]
    if all(t.dtype == dtype for t in present):
        cast = tensors
    elif len({t.dtype for t in present}) == 1:
        recorded = torch.is_grad_enabled() and \
            any(t.requires_grad for t in present)
        together = iter(_CastTogether.apply(dtype, *present) if recorded
                        else _cast_together(present, dtype))
        cast = [None if t is None else next(together) for t in tensors]
    else:
        cast = [None if t is None else t.to(dtype) for t in tensors]
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
        return _cast_together(tensors, dtype)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        # (autograd hands zeros for a result that got no gradient)
        flat = torch.cat([g.reshape(-1) for g in grads]).to(ctx.source)
        return (None, *_views(flat, ctx.shapes))


def _cast_together(tensors: Sequence[torch.Tensor], dtype: torch.dtype
                   ) -> Tuple[torch.Tensor, ...]:
    """``tuple(t.to(dtype) for t in tensors)`` in two launches (a copy into
    one buffer, one cast of it): views of one buffer. Inference calls it
    as it is, without an autograd node's cost on the CPU."""
    flat = torch.cat([t.reshape(-1) for t in tensors]).to(dtype)
    return _views(flat, [t.shape for t in tensors])


def _views(flat: torch.Tensor, shapes) -> Tuple[torch.Tensor, ...]:
    """``flat`` as consecutive tensors of ``shapes``."""
    sizes = [math.prod(shape) for shape in shapes]
    return tuple(part.view(shape)
                 for part, shape in zip(flat.split(sizes), shapes))
