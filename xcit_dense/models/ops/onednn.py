"""Linear and convolution calls on oneDNN, with fused epilogues.

For fp32 on CPU (outside autocast and ``torch.compile``) the modules' fast
paths use oneDNN's primitives -- the ones Inductor itself emits for CPU,
``torch.ops.mkldnn._linear_pointwise`` and ``_convolution_pointwise``. Their
fp32 GEMM is faster than the BLAS call behind ``F.linear`` for XCiT's
token-matrix shapes (forward and input gradient; ``torch.mm`` stays faster for
the weight gradient), and in inference they compute ``act(x W^T + b)`` or
``x W^T + b + residual`` as one kernel. In training the MLP is one autograd
function (:func:`mlp`) that keeps only the pre-activation and reuses buffers
in backward: on CPU, large fresh allocations are returned to the OS and
page-faulted in again on every use, which costs as much as the GEMMs
themselves for hidden-size tensors. The arithmetic is the same; outputs differ
from the standard operators only by float rounding (tested to 1e-4).

Everywhere else (autocast, ``torch.compile``, CUDA, other dtypes) the same
functions run ``F.linear`` / ``F.conv2d`` and element-wise ops, so autograd,
autocast and compilers see standard operators; so does the CPU with
``xcit_dense.set_fast_path(fused_kernels=False)`` (or ``with
fast_path(fused_kernels=False):``).
"""
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from ..policy import SWITCHES, operators_observed
from . import higher_order

_ONEDNN_OPS = (torch.backends.mkldnn.is_available()
               and hasattr(torch.ops.mkldnn, '_linear_pointwise')
               and hasattr(torch.ops.mkldnn, '_convolution_pointwise'))

ACTIVATIONS = (None, 'gelu')
#: ``'fused'``: oneDNN GEMMs and convolutions with fused epilogues (fp32 CPU
#: inference); ``'onednn'``: oneDNN GEMMs with autograd (fp32 CPU training);
#: ``'torch'``: standard operators.
BACKENDS = ('fused', 'onednn', 'torch')


#: Values of a token layer's input (batch x tokens x channels) from which
#: its oneDNN calls take less time than PyTorch's standard operators
#: (:func:`pays`), per backend: each oneDNN call costs more before its
#: arithmetic than ``F.linear``, which only large enough calls repay
#: (measured by ``python -m benchmarks.probes.onednn_size``).
MIN_VALUES = {'fused': 12288, 'onednn': 32768}


def select_backend(x: torch.Tensor, stochastic: bool,
                   by_size: bool = False) -> str:
    """The backend for a layer on ``x``: oneDNN for fp32 on CPU outside
    autocast, with fused epilogues when nothing is recorded for autograd and
    the layer has no live dropout or drop-path (``stochastic`` False: those
    are identities, so the residual can be added inside the kernel). Under
    ``torch.compile`` only the fused inference kernels are kept (as custom
    operators the compiler calls as they are); training is left to the
    compiler. With ``by_size`` (a token layer's (B, N, C) input), oneDNN
    only where it :func:`pays`. PyTorch's operators where a dispatch mode
    watches them (:func:`~xcit_dense.models.policy.operators_observed`)."""
    if not (SWITCHES.fused_kernels and _ONEDNN_OPS and x.device.type == 'cpu'
            and x.dtype == torch.float32
            and not torch.is_autocast_enabled('cpu')) or \
            operators_observed():
        return 'torch'
    if not stochastic and not torch.is_grad_enabled():
        backend = 'fused'
    else:
        backend = 'torch' if torch.compiler.is_compiling() else 'onednn'
    if backend != 'torch' and by_size and not pays(backend, x):
        return 'torch'
    return backend


def pays(backend: str, x: torch.Tensor) -> bool:
    """``backend``'s oneDNN calls on a token layer's input ``x`` take less
    time than the standard operators: ``x`` has at least
    :data:`MIN_VALUES` values."""
    return x.numel() >= MIN_VALUES[backend]


def _check(act: Optional[str], residual: Optional[torch.Tensor],
           backend: str) -> None:
    if act not in ACTIVATIONS:
        raise ValueError(f'act must be one of {ACTIVATIONS}, got {act!r}')
    if act is not None and residual is not None:
        raise ValueError('give either act or residual, not both')
    if backend not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS}, got '
                         f'{backend!r}')


def _epilogue(y: torch.Tensor, act: Optional[str],
              residual: Optional[torch.Tensor]) -> torch.Tensor:
    if act == 'gelu':
        y = F.gelu(y)
    if residual is not None:
        y = residual + y
    return y


def _onednn_mm(x: torch.Tensor, weight: torch.Tensor,
               bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, 'none', [], '')


class _OneDNNLinear(torch.autograd.Function):
    """``x @ weight.T + bias`` for 2-D ``x`` with oneDNN's GEMM forward and
    for the input gradient; the weight gradient uses ``torch.mm``, which is
    the faster of the two for that shape (measured). A recorded backward
    differentiates ``F.linear`` (:mod:`.higher_order`)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight, bias)
        ctx.has_bias = bias is not None
        return _onednn_mm(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight, bias = ctx.saved_tensors
        if higher_order.recorded():
            return higher_order.gradients(
                F.linear, (x, weight, bias), ctx.needs_input_grad, grad)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn_mm(grad, weight.t())
        if ctx.needs_input_grad[1]:
            grad_w = grad.t().mm(x)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(0)
        return grad_x, grad_w, grad_b


class _OneDNNMLP(torch.autograd.Function):
    """``gelu(x @ w1.T + b1) @ w2.T + b2`` for 2-D ``x`` on oneDNN GEMMs.
    Only the pre-activation is kept for backward (the hidden activation is
    recomputed from it, and its buffer then takes the hidden gradient, GELU's
    backward in place): one fewer hidden-size tensor stored per MLP, and one
    hidden-size buffer allocated in backward instead of two. A recorded
    backward differentiates :func:`_reference_mlp` (:mod:`.higher_order`)."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2):
        h = _onednn_mm(x, w1, b1)
        y = _onednn_mm(F.gelu(h), w2, b2)
        ctx.save_for_backward(x, w1, w2, h, b1, b2)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, w1, w2, h, b1, b2 = ctx.saved_tensors
        if higher_order.recorded():
            return higher_order.gradients(
                _reference_mlp, (x, w1, b1, w2, b2), ctx.needs_input_grad,
                grad)
        hidden = F.gelu(h)
        need = ctx.needs_input_grad
        grad_w2 = grad.t().mm(hidden) if need[3] else None
        grad_b2 = grad.sum(0) if need[4] else None
        hidden = torch.mm(grad, w2, out=hidden)  # gradient of the activation
        torch.ops.aten.gelu_backward.grad_input(hidden, h,
                                                grad_input=hidden)
        grad_x = _onednn_mm(hidden, w1.t()) if need[0] else None
        grad_w1 = hidden.t().mm(x) if need[1] else None
        grad_b1 = hidden.sum(0) if need[2] else None
        return grad_x, grad_w1, grad_b1, grad_w2, grad_b2


def _reference_mlp(x, w1, b1, w2, b2):
    """What :class:`_OneDNNMLP` computes, in PyTorch's operators."""
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor,
        w2: torch.Tensor, b2: torch.Tensor,
        residual: Optional[torch.Tensor] = None,
        backend: str = 'torch') -> torch.Tensor:
    """``gelu(x @ w1.T + b1) @ w2.T + b2`` (exact GELU), plus ``residual``
    if given."""
    if backend == 'onednn':
        lead = x.shape[:-1]
        y = _OneDNNMLP.apply(x.reshape(-1, x.shape[-1]), w1, b1, w2, b2)
        return _epilogue(y.view(*lead, -1), None, residual)
    hidden = linear(x, w1, b1, act='gelu', backend=backend)
    return linear(hidden, w2, b2, residual=residual, backend=backend)


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: Optional[torch.Tensor], act: Optional[str] = None,
           residual: Optional[torch.Tensor] = None,
           backend: str = 'torch') -> torch.Tensor:
    """``act(x @ weight.T + bias)``, plus ``residual`` if given (added after
    the activation; ``act`` and ``residual`` are not combined). ``backend``
    from :func:`select_backend`."""
    _check(act, residual, backend)
    if backend == 'torch':
        return _epilogue(F.linear(x, weight, bias), act, residual)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if backend == 'onednn':
        y = _OneDNNLinear.apply(x2, weight, bias).view(*lead, -1)
        return _epilogue(y, act, residual)
    if residual is not None:
        residual = residual.reshape(-1, weight.shape[0])
    call = fused_linear if torch.compiler.is_compiling() else _fused_linear
    y = call(x2, weight, bias, act or 'none', residual)
    return y.view(*lead, weight.shape[0])


def _fused_linear(x: torch.Tensor, weight: torch.Tensor,
                  bias: Optional[torch.Tensor], act: str,
                  residual: Optional[torch.Tensor]) -> torch.Tensor:
    """oneDNN ``act(x @ weight.T + bias) (+ residual)`` for 2-D ``x``."""
    if residual is not None:
        return torch.ops.mkldnn._linear_pointwise.binary(
            x, residual, weight, bias, 'add')
    if act == 'gelu':
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, 'gelu',
                                                  [], 'none')
    return _onednn_mm(x, weight, bias)


#: :func:`_fused_linear` as a custom operator, so that ``torch.compile``
#: calls it as it is; eager calls run the function itself (the operator's
#: dispatch costs about 14 us a call, as much as a small call's GEMM)
fused_linear = torch.library.custom_op(
    'xcit_dense::fused_linear', mutates_args=())(_fused_linear)


@fused_linear.register_fake
def _(x, weight, bias, act, residual):
    return x.new_empty(x.shape[0], weight.shape[0])


def conv2d(x: torch.Tensor, weight: torch.Tensor,
           bias: Optional[torch.Tensor], stride: Sequence[int],
           padding: Sequence[int], groups: int = 1,
           act: Optional[str] = None,
           residual: Optional[torch.Tensor] = None,
           backend: str = 'torch') -> torch.Tensor:
    """``act(conv2d(x, weight, bias))``, plus ``residual`` if given; with the
    ``'fused'`` backend one oneDNN kernel (channels-last in, channels-last
    out)."""
    _check(act, residual, backend)
    stride, padding = list(stride), list(padding)
    if backend != 'fused':
        return _epilogue(
            F.conv2d(x, weight, bias, stride, padding, 1, groups), act,
            residual)
    call = fused_conv2d if torch.compiler.is_compiling() else _fused_conv2d
    return call(x, weight, bias, stride, padding, groups, act or 'none',
                residual)


def _fused_conv2d(x: torch.Tensor, weight: torch.Tensor,
                  bias: Optional[torch.Tensor], stride: List[int],
                  padding: List[int], groups: int, act: str,
                  residual: Optional[torch.Tensor]) -> torch.Tensor:
    """oneDNN ``act(conv2d(x)) (+ residual)``."""
    if residual is not None:
        return torch.ops.mkldnn._convolution_pointwise.binary(
            x, residual, weight, bias, padding, stride, [1, 1], groups, 'add',
            1.0, None, [], None)
    return torch.ops.mkldnn._convolution_pointwise(
        x, weight, bias, padding, stride, [1, 1], groups, act, [],
        'none' if act == 'gelu' else '')


#: :func:`_fused_conv2d` as a custom operator (see :data:`fused_linear`)
fused_conv2d = torch.library.custom_op(
    'xcit_dense::fused_conv2d', mutates_args=())(_fused_conv2d)


@fused_conv2d.register_fake
def _(x, weight, bias, stride, padding, groups, act, residual):
    B, _, H, W = x.shape
    kh, kw = weight.shape[-2:]
    shape = (B, weight.shape[0], (H + 2 * padding[0] - kh) // stride[0] + 1,
             (W + 2 * padding[1] - kw) // stride[1] + 1)
    channels_last = x.is_contiguous(memory_format=torch.channels_last)
    return x.new_empty(shape).contiguous(
        memory_format=torch.channels_last if channels_last else
        torch.contiguous_format)
