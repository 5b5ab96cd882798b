"""The 2x2 stride-2 transposed convolution of tokens as one GEMM and a pixel
shuffle.

Each input token produces a 2 x 2 patch of output pixels: ``x W`` with
``W`` of shape (C_in, C_out * 4) gives them all, and the pixel shuffle writes
them to their places. Without autograd the GEMM runs by bands of rows (see
:mod:`.pieces`).
"""
from typing import List, Optional

import torch

from . import onednn
from .pieces import in_pieces, piece_tokens


def upsample2x(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
               act: Optional[str], H: int, W: int, nchw: bool,
               backend: str) -> torch.Tensor:
    """``act(conv_transpose2d(x, weight, bias, stride=2))`` of (B, H*W, C)
    tokens; ``weight`` (C_in, C_out, 2, 2) as in ``nn.ConvTranspose2d``.
    Returns (B, 4*H*W, C_out) tokens or, with ``nchw``, an NCHW map."""
    B, C_out = x.shape[0], weight.shape[1]
    if nchw and act is None and not torch.is_grad_enabled():
        return _upsample2x_nchw(x, weight, bias, H, W, backend)
    if nchw:  # GEMM columns (C_out, ky, kx)
        w_mat = weight.flatten(1).t()
        b_vec = bias.repeat_interleave(4)
        shape, patches = (B, C_out, 2 * H, 2 * W), (B, C_out, H, 2, W, 2)
    else:  # GEMM columns (ky, kx, C_out)
        w_mat = weight.permute(2, 3, 1, 0).flatten(0, 2)
        b_vec = bias.repeat(4)
        shape, patches = (B, 4 * H * W, C_out), (B, H, 2, W, 2, C_out)
    out = None
    for band in _bands(H, W, 4 * C_out, x):
        y = onednn.linear(x[:, band.start * W:band.stop * W], w_mat, b_vec,
                          act=act, backend=backend)
        if out is None:  # in the GEMM's dtype (autocast's where it is on),
            # as nn.ConvTranspose2d's output
            out = y.new_empty(shape)
            dst = out.view(patches)
        R = band.stop - band.start
        # the pixel shuffle, written into the output (much faster on CPU
        # than ``.reshape`` of the permuted view)
        if nchw:
            dst[:, :, band].copy_(
                y.view(B, R, W, C_out, 2, 2).permute(0, 3, 1, 4, 2, 5))
        else:
            dst[:, band].copy_(
                y.view(B, R, W, 2, 2, C_out).permute(0, 1, 3, 2, 4, 5))
    return out


def _upsample2x_nchw(x: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor, H: int, W: int,
                     backend: str) -> torch.Tensor:
    """:func:`upsample2x` to an NCHW map without autograd: the GEMM is
    computed transposed, ``(C_out, ky, kx) x tokens``, so that the pixel
    shuffle interleaves two contiguous rows per output row (``kx``) instead
    of gathering pairs of values a token apart, and adds the bias as it
    writes."""
    B, C_out = x.shape[0], weight.shape[1]
    w_mat = weight.flatten(1).t().contiguous()  # rows (C_out, ky, kx)
    if torch.compiler.is_compiling():  # one kernel writes the output
        y = torch.stack([onednn.linear(w_mat, x[b], None, backend=backend)
                         for b in range(B)]).view(B, C_out, 2, 2, H, W)
        y = y + bias.to(y.dtype).view(1, C_out, 1, 1, 1, 1)
        return y.permute(0, 1, 4, 2, 5, 3).reshape(B, C_out, 2 * H, 2 * W)
    out = None
    for b in range(B):
        for band in _bands(H, W, 4 * C_out, x):
            y = onednn.linear(w_mat, x[b, band.start * W:band.stop * W], None,
                              backend=backend)
            if out is None:  # the GEMM's dtype, as in upsample2x, and the
                # bias in it, as autocast casts nn.ConvTranspose2d's (an
                # fp32 bias made each add compute in fp32 into a temporary
                # that was then copied into the half-precision output)
                out = y.new_empty(B, C_out, 2 * H, 2 * W)
                dst = out.view(B, C_out, H, 2, W, 2)
                bias = bias.to(y.dtype).view(C_out, 1, 1, 1)
            y = y.view(C_out, 2, 2, band.stop - band.start, W)
            for kx in range(2):  # (C_out, rows, ky, W), W stride 2
                torch.add(y[:, :, kx].transpose(1, 2), bias,
                          out=dst[b, :, band, :, :, kx])
    return out


def _bands(H: int, W: int, width: int, x: torch.Tensor) -> List[slice]:
    """Bands of rows of an H x W token map processed one at a time (all rows
    at once unless :func:`.pieces.in_pieces`, without a loop over ``H``
    that a compiler with dynamic shapes would specialise)."""
    if not in_pieces(x):
        return [slice(0, H)]
    rows = max(1, min(H, piece_tokens(H * W, width, x) // W))
    return [slice(r, min(r + rows, H)) for r in range(0, H, rows)]
