"""Gradients handed to the parameters in the parameters' own strides.

A convolution on channels-last maps returns its weight gradient in
channels-last strides. For a depth-wise weight (C, 1, 3, 3) those are
(9, 1, 3, 1) where the parameter has (9, 9, 3, 1); for a 1x1 weight
(O, I, 1, 1), (I, 1, I, I) where the parameter has (I, 1, 1, 1). The memory
order is the same (the dimensions that differ have size 1), so autograd's
layout contract accepts such a gradient as it is, but
DistributedDataParallel compares strides exactly, copies the gradient into
its bucket on every step and warns ``Grad strides do not match bucket view
strides``. XCiT's maps are channels-last views of its (B, N, C) tokens in
the straightforward computation and the fast paths alike (LPI's depth-wise
convolutions, the positional encoding's 1x1 projection), on the CPU and on
CUDA.

:func:`keep_grad_layouts` gives each such parameter a gradient hook that
re-strides what arrives before it is accumulated: the computation itself is
untouched, whichever module (the model's own, a subclass, a replacement)
produced the gradient.
"""
import weakref
from typing import Dict

import torch
import torch.nn as nn

# the parameters that have the hook, by id (a tensor's == is elementwise,
# so no weak set): a copied model (deepcopy, pickling) has new parameters
# without hooks, which get theirs on its next forward
_HOOKED: Dict[int, 'weakref.ref[torch.Tensor]'] = {}
# the modules whose parameters were all looked at since they were last put
# in training mode (walking a backbone's parameters takes about a
# millisecond, too much for every forward): a copied model is a new module,
# and a submodule replaced before training starts is seen then
_KEPT: 'weakref.WeakSet[nn.Module]' = weakref.WeakSet()


def _may_arrive_in_other_strides(param: torch.Tensor) -> bool:
    """Gradients that differ from ``param`` only in the strides of size-1
    dimensions pass autograd's layout contract as they are; any other
    difference autograd itself copies into the parameter's strides."""
    return param.requires_grad and param.dim() > 1 and 1 in param.shape


def _restride_hook(param: torch.Tensor):
    ref = weakref.ref(param)

    def restride(grad: torch.Tensor) -> torch.Tensor:
        target = ref()
        if target is None or grad.stride() == target.stride():
            return grad
        return grad.new_empty_strided(grad.shape,
                                      target.stride()).copy_(grad)

    return restride


def keep_grad_layouts(module: nn.Module) -> None:
    """Give every parameter of ``module`` whose gradient may arrive in other
    strides a hook that hands it over in the parameter's own (idempotent;
    the parameters are looked at again only after
    :func:`look_at_parameters_again`)."""
    if module in _KEPT:
        return
    for param in module.parameters():
        hooked = _HOOKED.get(id(param))
        if (hooked is not None and hooked() is param) or \
                not _may_arrive_in_other_strides(param):
            continue
        param.register_hook(_restride_hook(param))
        key = id(param)
        _HOOKED[key] = weakref.ref(param, lambda _, key=key: _HOOKED.pop(
            key, None))
    _KEPT.add(module)


def look_at_parameters_again(module: nn.Module) -> None:
    """Have the next :func:`keep_grad_layouts` of ``module`` look at its
    parameters again (they may have been replaced): called when it is put
    in training mode."""
    _KEPT.discard(module)
