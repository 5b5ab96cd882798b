"""Folding normalisation and layer scale into the weights before them."""
import weakref
from typing import Callable, Dict, Hashable, Optional, Tuple, TypeVar

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

T = TypeVar('T')

#: module -> slot -> (what the folding read, its result)
_KEPT: 'weakref.WeakKeyDictionary[nn.Module, Dict[Hashable, tuple]]' = \
    weakref.WeakKeyDictionary()


def fold_batchnorm(
        weight: torch.Tensor, bias: Optional[torch.Tensor], norm: nn.Module
) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """Weight and bias of ``norm(conv(x))`` as one convolution, for a
    BatchNorm that uses running statistics (eval mode); ``None`` otherwise
    (batch statistics, or any other norm). ``weight`` has output channels
    first."""
    if not isinstance(norm, _BatchNorm) or norm.training or \
            norm.running_var is None:
        return None
    scale = torch.rsqrt(norm.running_var + norm.eps)
    if norm.weight is not None:
        scale = scale * norm.weight
    shift = -norm.running_mean * scale
    if norm.bias is not None:
        shift = shift + norm.bias
    if bias is not None:
        shift = shift + bias * scale
    return weight * scale.view(-1, *([1] * (weight.dim() - 1))), shift


def fold_scale(weight: torch.Tensor, bias: Optional[torch.Tensor],
               gamma: Optional[torch.Tensor]
               ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Weight and bias of ``gamma * layer(x)`` (a per-output-channel layer
    scale) as one layer; unchanged when ``gamma`` is ``None``."""
    if gamma is None:
        return weight, bias
    weight = weight * gamma.view(-1, *([1] * (weight.dim() - 1)))
    return weight, None if bias is None else bias * gamma


def kept(owner: nn.Module, slot: Hashable, fold: Callable[[], T],
         *reads: object) -> T:
    """``fold()`` (a folding of ``owner``'s weights), computed once and
    given again while what it ``reads`` is unchanged: the same objects
    (modules, tensors, settings), each tensor at the same version and in
    the same memory (an in-place update, ``load_state_dict`` among them,
    and new data, ``.to()`` or ``.half()``, count as changes).
    Computed afresh where autograd records, under ``torch.compile`` and
    while a CUDA graph captures (its replays then fold the weights as they
    are, in-place updates included). On a GPU, where the eager forward is
    bound by kernel launches, a folding per call launches more kernels
    than the norm it removes; kept, none."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling() or (
            torch.cuda.is_available() and
            torch.cuda.is_current_stream_capturing()):
        return fold()
    versions = tuple((r._version, r.data_ptr(), r.dtype, r.device)
                     if isinstance(r, torch.Tensor) else None for r in reads)
    slots = _KEPT.setdefault(owner, {})
    entry = slots.get(slot)
    if entry is not None and len(entry[0]) == len(reads) and all(
            a is b for a, b in zip(entry[0], reads)) and entry[1] == versions:
        return entry[2]
    result = fold()
    slots[slot] = (reads, versions, result)
    return result


def kept_batchnorm_fold(owner: nn.Module, slot: Hashable,
                        weight: torch.Tensor, bias: Optional[torch.Tensor],
                        norm: nn.Module, transposed: bool = False
                        ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """:func:`fold_batchnorm` of a convolution's ``weight`` and ``bias``
    (a transposed convolution's, input channels first, with
    ``transposed``) and ``norm``, :func:`kept` in ``owner`` under
    ``slot``."""
    def fold():
        folded = fold_batchnorm(weight.transpose(0, 1) if transposed
                                else weight, bias, norm)
        if folded is None or not transposed:
            return folded
        return folded[0].transpose(0, 1), folded[1]
    return kept(owner, slot, fold, weight, bias, norm, *(
        getattr(norm, name, None) for name in (
            'weight', 'bias', 'running_mean', 'running_var', 'eps',
            'training')))
