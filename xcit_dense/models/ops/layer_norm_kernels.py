"""The blocks' pre-norms (``nn.LayerNorm`` over the channels of (B, N, C)
tokens) in Triton kernels whose output is in the dtype the next layer takes.

Under autocast PyTorch's LayerNorm computes in fp32 and returns fp32 (it is
on autocast's fp32 list), and the layer after it casts that to fp16 or bf16:
a norm and a cast forward, a norm's backward and a cast's backward. Here one
kernel normalises and writes autocast's dtype, and one kernel takes the
gradient back (with the weight's and bias's gradients summed per tile, then
over the tiles). The mean and variance are computed in fp32, in two passes
over each token's channels held in registers; the output is rounded once;
the input's gradient comes back in the input's dtype (the residual stream's)
and the weight's and bias's in theirs. Triton compiles for CUDA;
``TRITON_INTERPRET=1`` (set before Triton is imported) runs the same kernels
on CPU tensors, as the tests do.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import policy
from . import higher_order, triton_support
from .triton_support import available, tl, triton  # noqa: F401 (available)

#: channels' block x tokens per program: about this many values each
_VALUES_PER_PROGRAM = 4096

if triton is not None:

    @triton.jit
    def _rows(M, C, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
        """This program's tokens and channels: offsets (64-bit) into a
        (M, C) tensor and which of them exist."""
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_C)
        row_ok, col_ok = rows < M, cols < C
        offsets = rows.to(tl.int64)[:, None] * C + cols[None, :]
        return rows, cols, row_ok, col_ok, offsets, \
            row_ok[:, None] & col_ok[None, :]

    @triton.jit
    def _forward(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, C, eps,
                 BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
        rows, cols, row_ok, col_ok, offsets, mask = _rows(M, C, BLOCK_M,
                                                          BLOCK_C)
        x = tl.load(x_ptr + offsets, mask=mask, other=0.).to(tl.float32)
        mean = tl.sum(x, axis=1) / C
        centred = tl.where(mask, x - mean[:, None], 0.)
        rstd = 1. / tl.sqrt(tl.sum(centred * centred, axis=1) / C + eps)
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.).to(tl.float32)
        y = centred * rstd[:, None] * w[None, :] + b[None, :]
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(mean_ptr + rows, mean, mask=row_ok)
        tl.store(rstd_ptr + rows, rstd, mask=row_ok)

    @triton.jit
    def _backward(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr,
                  partial_ptr, M, C, BLOCK_M: tl.constexpr,
                  BLOCK_C: tl.constexpr):
        """``dx``, and into ``partial_ptr`` (programs, 2, C) this tile's
        sums of ``dy * x_hat`` and ``dy`` (the weight's and the bias's
        gradients)."""
        rows, cols, row_ok, col_ok, offsets, mask = _rows(M, C, BLOCK_M,
                                                          BLOCK_C)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.).to(tl.float32)
        x = tl.load(x_ptr + offsets, mask=mask, other=0.).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.)
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.).to(tl.float32)
        x_hat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.)
        w_dy = dy * w[None, :]
        c1 = tl.sum(x_hat * w_dy, axis=1) / C
        c2 = tl.sum(w_dy, axis=1) / C
        dx = (w_dy - (x_hat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty),
                 mask=mask)
        tile = partial_ptr + tl.program_id(0).to(tl.int64) * 2 * C + cols
        tl.store(tile, tl.sum(dy * x_hat, axis=0), mask=col_ok)
        tl.store(tile + C, tl.sum(dy, axis=0), mask=col_ok)


def _blocks(C: int):
    """Channels' block (the channels rounded up to a power of 2) and tokens
    per program."""
    block_c = triton.next_power_of_2(C)
    return max(1, _VALUES_PER_PROGRAM // block_c), block_c


class _LayerNorm(torch.autograd.Function):
    """(M, C) ``x`` -> ``F.layer_norm(x, (C,), weight, bias, eps)`` in
    ``dtype``: one kernel forward; one backward, then a sum over its tiles
    for the weight's and bias's gradients. A recorded backward
    differentiates :func:`_reference` (:mod:`.higher_order`)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, dtype):
        M, C = x.shape
        block_m, block_c = _blocks(C)
        y = x.new_empty((M, C), dtype=dtype)
        mean, rstd = (x.new_empty(M, dtype=torch.float32) for _ in range(2))
        _forward[(triton.cdiv(M, block_m),)](
            x, weight, bias, y, mean, rstd, M, C, eps, BLOCK_M=block_m,
            BLOCK_C=block_c, num_warps=4)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.eps, ctx.dtype = eps, dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        if higher_order.recorded():
            return (*higher_order.gradients(
                lambda *xwb: _reference(*xwb, ctx.eps, ctx.dtype),
                (x, weight, bias), ctx.needs_input_grad[:3], dy), None, None)
        M, C = x.shape
        block_m, block_c = _blocks(C)
        programs = triton.cdiv(M, block_m)
        dx = torch.empty_like(x)
        partial = x.new_empty((programs, 2, C), dtype=torch.float32)
        _backward[(programs,)](
            dy.contiguous(), x, weight, mean, rstd, dx, partial, M, C,
            BLOCK_M=block_m, BLOCK_C=block_c, num_warps=8)
        dw, db = partial.sum(0)
        return dx, dw.to(weight.dtype), db.to(bias.dtype), None, None


def _reference(x, weight, bias, eps, dtype):
    """What :class:`_LayerNorm` computes, as autocast's ``nn.LayerNorm``
    and the cast after it do: in fp32, then in ``dtype``."""
    return F.layer_norm(x.float(), x.shape[-1:], weight.float(),
                        bias.float(), eps).to(dtype)


def layer_norm(x: torch.Tensor, norm: nn.LayerNorm,
               dtype: torch.dtype) -> torch.Tensor:
    """``norm(x)`` of (B, N, C) tokens, in ``dtype``."""
    with triton_support.on_device(x):
        y = _LayerNorm.apply(x.reshape(-1, x.shape[-1]).contiguous(),
                             norm.weight, norm.bias, norm.eps, dtype)
    return y.view(x.shape)


def pre_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` of (B, N, C) tokens, under autocast in the dtype the
    layer after it takes (autocast's: its LayerNorm computes and returns
    fp32, which that layer casts): in the kernels for a plain
    ``nn.LayerNorm`` over the channels (:func:`.policy.is_plain_layer_norm`)
    where they compile and run; else ``norm(x)``, as it is."""
    dtype = policy.kernel_dtype(x)
    if not torch.is_autocast_enabled(x.device.type) or \
            dtype not in policy.KERNEL_DTYPES or \
            x.dtype not in policy.KERNEL_DTYPES or not available() or \
            not policy.is_plain_layer_norm(norm, x.shape[-1]) or \
            not works(x.device, x.dtype, dtype, x.shape[-1]):
        return norm(x)
    return layer_norm(x, norm, dtype)


def probe(device: torch.device, dtype: torch.dtype, out_dtype: torch.dtype,
          channels: int, backward: bool) -> None:
    """The kernels on a tiny input: 5 tokens of ``channels`` channels."""
    norm = nn.LayerNorm(channels).to(device)
    x = torch.randn(1, 5, channels, device=device, dtype=dtype,
                    requires_grad=backward)
    y = layer_norm(x, norm, out_dtype)
    if backward:
        torch.autograd.grad(y.float().sum(), (x, norm.weight, norm.bias))


def works(device: torch.device, dtype: torch.dtype, out_dtype: torch.dtype,
          channels: int) -> bool:
    """The kernels compile and run on ``device`` for ``dtype`` tokens of
    ``channels`` channels normalised into ``out_dtype``, and gradients if
    they are recorded now (probed once per variant, see
    :func:`.triton_support.works`)."""
    return triton_support.works(
        'LayerNorm', device, dtype, probe, out_dtype=out_dtype,
        channels=channels, backward=torch.is_grad_enabled())
