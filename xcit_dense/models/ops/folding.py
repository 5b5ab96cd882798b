"""Folding normalisation and layer scale into the weights before them."""
from typing import Hashable, Optional, Tuple

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from .derived import kept


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


def kept_scale_fold(owner: nn.Module, slot: Hashable, weight: torch.Tensor,
                    bias: Optional[torch.Tensor],
                    gamma: Optional[torch.Tensor]
                    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """:func:`fold_scale`, :func:`.derived.kept` in ``owner`` under ``slot``
    (in inference, computed once while the weights and ``gamma`` stay as
    they are; where autograd records, on every call, so that ``gamma``
    and the weight get their gradients)."""
    if gamma is None:
        return weight, bias
    return kept(owner, slot, lambda: fold_scale(weight, bias, gamma),
                weight, bias, gamma)


def kept_batchnorm_fold(owner: nn.Module, slot: Hashable,
                        weight: torch.Tensor, bias: Optional[torch.Tensor],
                        norm: nn.Module, transposed: bool = False
                        ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """:func:`fold_batchnorm` of a convolution's ``weight`` and ``bias``
    (a transposed convolution's, input channels first, with
    ``transposed``) and ``norm``, :func:`.derived.kept` in ``owner`` under
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
