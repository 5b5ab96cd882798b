"""Linear and convolution calls with fused epilogues, and their fall-backs.

For fp32 inference on CPU (no autograd, no autocast, not being traced by
``torch.compile``) the XCiT forward pass uses oneDNN's fused primitives -- the
ones Inductor itself emits for CPU, ``torch.ops.mkldnn._linear_pointwise`` and
``torch.ops.mkldnn._convolution_pointwise`` -- so that ``act(x W^T + b)`` or
``x W^T + b + residual`` is one kernel. oneDNN's fp32 GEMM is also faster than
the BLAS call behind ``F.linear`` for the token-matrix shapes of XCiT (measured
in the README's benchmark section). The arithmetic is the same; outputs differ
from the unfused operators only by float rounding (tested to 1e-4).

Everywhere else (training, autocast, ``torch.compile``, CUDA, other dtypes) the
same functions run ordinary ``F.linear`` / ``F.conv2d`` and element-wise ops,
so autograd, autocast and compilers see standard operators.
"""
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

_ONEDNN_OPS = (torch.backends.mkldnn.is_available()
               and hasattr(torch.ops.mkldnn, '_linear_pointwise')
               and hasattr(torch.ops.mkldnn, '_convolution_pointwise'))
_enabled = True

ACTIVATIONS = (None, 'gelu')


def set_fused_kernels(enabled: bool) -> None:
    """Switch the oneDNN fused kernels on or off globally (on by default);
    off, every call takes the plain PyTorch path."""
    global _enabled
    _enabled = bool(enabled)


def fused_kernels_available(x: torch.Tensor) -> bool:
    """Whether the fused oneDNN kernels can be used for ``x`` right now."""
    return (_enabled and _ONEDNN_OPS and x.device.type == 'cpu'
            and x.dtype == torch.float32 and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled('cpu')
            and not torch.compiler.is_compiling())


def _check_act(act: Optional[str]) -> None:
    if act not in ACTIVATIONS:
        raise ValueError(f'act must be one of {ACTIVATIONS}, got {act!r}')


def _plain_epilogue(y: torch.Tensor, act: Optional[str],
                    residual: Optional[torch.Tensor]) -> torch.Tensor:
    if act == 'gelu':
        y = F.gelu(y)
    if residual is not None:
        y = residual + y
    return y


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: Optional[torch.Tensor], act: Optional[str] = None,
           residual: Optional[torch.Tensor] = None,
           fused: bool = False) -> torch.Tensor:
    """``act(x @ weight.T + bias)``, plus ``residual`` if given (added after
    the activation; ``act`` and ``residual`` are not combined).

    ``fused=True`` (check :func:`fused_kernels_available` first) computes it
    with one oneDNN kernel.
    """
    _check_act(act)
    if act is not None and residual is not None:
        raise ValueError('linear: give either act or residual, not both')
    if not fused:
        return _plain_epilogue(F.linear(x, weight, bias), act, residual)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if residual is not None:
        y = torch.ops.mkldnn._linear_pointwise.binary(
            x2, residual.reshape(-1, weight.shape[0]), weight, bias, 'add')
    elif act == 'gelu':
        y = torch.ops.mkldnn._linear_pointwise(x2, weight, bias, 'gelu', [],
                                               'none')
    else:
        y = torch.ops.mkldnn._linear_pointwise(x2, weight, bias, 'none', [],
                                               '')
    return y.view(*lead, weight.shape[0])


def conv2d(x: torch.Tensor, weight: torch.Tensor,
           bias: Optional[torch.Tensor], stride: Sequence[int],
           padding: Sequence[int], groups: int = 1,
           act: Optional[str] = None,
           residual: Optional[torch.Tensor] = None,
           fused: bool = False) -> torch.Tensor:
    """``act(conv2d(x, weight, bias))``, plus ``residual`` if given.

    With ``fused=True`` the convolution runs in oneDNN with the activation or
    the residual addition as its epilogue; channels-last inputs give
    channels-last outputs.
    """
    _check_act(act)
    if act is not None and residual is not None:
        raise ValueError('conv2d: give either act or residual, not both')
    stride, padding = list(stride), list(padding)
    if not fused:
        return _plain_epilogue(
            F.conv2d(x, weight, bias, stride, padding, 1, groups), act,
            residual)
    if residual is not None:
        return torch.ops.mkldnn._convolution_pointwise.binary(
            x, residual, weight, bias, padding, stride, [1, 1], groups, 'add',
            1.0, None, [], None)
    return torch.ops.mkldnn._convolution_pointwise(
        x, weight, bias, padding, stride, [1, 1], groups,
        'gelu' if act == 'gelu' else 'none', [],
        'none' if act == 'gelu' else '')
