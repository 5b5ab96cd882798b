"""Folding normalisation and layer scale into the weights before them.

The folds are computed on every call from the weights as they are: a
weight written in any way (an optimizer step, ``load_state_dict``, or
through ``.data``, as mmengine's ``EMAHook`` and mmdet's ``MeanTeacherHook``
write theirs, which no version counter records) is read by the next call.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn

from ..policy import is_plain_batch_norm


def fold_batchnorm(
        weight: torch.Tensor, bias: Optional[torch.Tensor], norm: nn.Module,
        transposed: bool = False
) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """Weight and bias of ``norm(conv(x))`` as one convolution, for a
    BatchNorm that uses running statistics (eval mode) and is exactly one of
    :data:`~xcit_dense.models.policy.BATCH_NORMS`, its call not customised;
    ``None`` otherwise (batch statistics, a subclass, a hooked BatchNorm,
    any other norm: the caller calls it). ``weight`` has output channels
    first, or with ``transposed`` (a transposed convolution's) input
    channels first."""
    if not is_plain_batch_norm(norm) or norm.training or \
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
    shape = [1] * weight.dim()
    shape[1 if transposed else 0] = -1
    return weight * scale.view(shape), shift


def fold_scale(weight: torch.Tensor, bias: Optional[torch.Tensor],
               gamma: Optional[torch.Tensor]
               ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Weight and bias of ``gamma * layer(x)`` (a per-output-channel layer
    scale) as one layer; unchanged when ``gamma`` is ``None``."""
    if gamma is None:
        return weight, bias
    weight = weight * gamma.view(-1, *([1] * (weight.dim() - 1)))
    return weight, None if bias is None else bias * gamma
