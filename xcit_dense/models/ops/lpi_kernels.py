"""LPI in Triton kernels, forward and backward: the depth-wise 3x3
convolution, GELU, BatchNorm and depth-wise 3x3 convolution of local patch
interaction, with the block's layer scale and residual, computed on the
(B, N, C) tokens as they lie (channels last), in three kernels forward and
five backward instead of the straightforward computation's NCHW copies and
one kernel per operation (and no other operation between them).

One concept in one file, kernels beside the autograd function that launches
them, though longer than the package's other files.

For tokens ``y`` of an H x W grid, per channel::

    a = GELU(conv1(y))                     (_forward: GELU; in training also
                                            each tile's mean and M2 of a)
    mean, var: the batch's (training) or the running ones  (_statistics,
          which also updates the running averages as nn.BatchNorm2d does;
          in inference _forward reads the running ones itself)
    z = a * scale + shift                  (BatchNorm, scale = w / std)
    out = residual + gamma * conv2(z)      (_forward: the norm read through)

Backward: ``_backward`` takes ``dout`` back through conv2 (``dz``, with the
sums for conv2's and the layer scale's gradients and BatchNorm's two
per-channel sums, per tile), ``_parameter_gradients`` adds the tiles' sums
into those gradients and BatchNorm's backward coefficients,
``_gelu_backward`` goes through BatchNorm and GELU (recomputing
``conv1(y)``), then ``_backward`` and ``_parameter_gradients`` again through
conv1 (``dy``, conv1's gradients). Only ``y`` and ``a`` are kept for it.
Everything is accumulated in fp32 whatever the tokens' dtype (fp32, or
fp16 / bf16 under autocast); the batch variance combines the tiles' M2
(combined as in Chan et al.), not sums of squares.
Triton compiles for CUDA; ``TRITON_INTERPRET=1`` runs the same kernels on
CPU tensors, as the tests do.
"""
from typing import Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from . import higher_order, triton_support
from .triton_support import available, tl, triton  # noqa: F401 (available)

#: tokens and channels per tile, and warps per program of the tile kernels
#: (``_forward``, ``_backward``, ``_gelu_backward``): over 4 warps the
#: backward's nine taps spilled registers where the channels' count is not
#: a multiple of 16; over 8 no tile kernel uses local memory, on sm_80 or
#: sm_90, and at XCiT-S12's 384 channels they take 52 to 122 registers
#: (``tools/compile_kernels.py``)
BLOCK_N = 32
BLOCK_C = 64
TILE_WARPS = 8
#: per tile of ``_backward``: 9 taps' and the bias's sums, then
#: BatchNorm's sums of dz and dz * (a - mean) / std
_SUMS = 12
#: channels per program of ``_parameter_gradients``, and tiles' sums
#: added per step of it and of ``_statistics`` (loads in flight at once, not
#: one tile after another)
_REDUCE_C = 32
_CHUNK = 32


if triton is not None:

    @triton.jit
    def _tile(tiles, C, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
        """This program's index (its image's ``tiles`` tiles of tokens
        along axis 0), its tokens, its channels and which of those exist."""
        pid = tl.program_id(0)
        rn = (pid % tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
        rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        return pid, rn, rc, rc < C

    @triton.jit
    def _stats(stats_ptr, row, rc, cmask, C):
        """Rows ``row`` and ``row + 1`` of the (5, C) statistics (mean,
        1 / std, scale, shift, variance) at channels ``rc``."""
        first = tl.load(stats_ptr + row * C + rc, mask=cmask, other=0.)
        second = tl.load(stats_ptr + (row + 1) * C + rc, mask=cmask,
                         other=0.)
        return first, second

    @triton.jit
    def _coefficients(weight_ptr, bias_ptr, mean, var, eps, rc, cmask):
        """BatchNorm's 1 / std, scale and shift at channels ``rc`` for
        the mean and variance given."""
        rstd = 1 / tl.sqrt(var + eps)
        scale = tl.load(weight_ptr + rc, mask=cmask, other=0.).to(
            tl.float32) * rstd
        shift = tl.load(bias_ptr + rc, mask=cmask, other=0.).to(
            tl.float32) - mean * scale
        return rstd, scale, shift

    @triton.jit
    def _running(rmean_ptr, rvar_ptr, rc, cmask):
        """The running mean and variance at channels ``rc``, in fp32
        (a model cast to half precision keeps them in its dtype)."""
        mean = tl.load(rmean_ptr + rc, mask=cmask, other=0.).to(tl.float32)
        var = tl.load(rvar_ptr + rc, mask=cmask, other=1.).to(tl.float32)
        return mean, var

    @triton.jit
    def _neighbours(rn, N, H, W, di, dj):
        """Each token's neighbour at (di, dj) on the H x W grid: its index
        and whether it is on the grid (zero padding elsewhere)."""
        i = rn // W
        j = rn % W
        on_grid = (rn < N) & (i + di >= 0) & (i + di < H) & \
            (j + dj >= 0) & (j + dj < W)
        return rn + di * W + dj, on_grid

    @triton.jit
    def _conv3x3(src_ptr, w_ptr, scale, shift, rn, rc, cmask, N, H, W, C,
                 AFFINE: tl.constexpr, FLIP: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
        """``sum_k w[c, k] s(p + o_k)`` over the 3x3 taps ``o_k`` for the
        tile's tokens ``p`` and channels ``c`` (FLIP: ``s(p - o_k)``, the
        transposed convolution), with ``s`` the (N, C) ``src`` or, with
        AFFINE, ``src * scale + shift``, zero off the grid."""
        acc = tl.zeros((BLOCK_N, BLOCK_C), dtype=tl.float32)
        for di in tl.static_range(3):
            for dj in tl.static_range(3):
                if FLIP:
                    idx, on_grid = _neighbours(rn, N, H, W, 1 - di, 1 - dj)
                else:
                    idx, on_grid = _neighbours(rn, N, H, W, di - 1, dj - 1)
                m = on_grid[:, None] & cmask[None, :]
                s = tl.load(src_ptr + idx[:, None] * C + rc[None, :], mask=m,
                            other=0.).to(tl.float32)
                if AFFINE:
                    s = tl.where(m, s * scale[None, :] + shift[None, :], 0.)
                w = tl.load(w_ptr + rc * 9 + di * 3 + dj, mask=cmask,
                            other=0.).to(tl.float32)
                acc += s * w[None, :]
        return acc

    @triton.jit
    def _forward(src_ptr, w_ptr, bias_ptr, stats_ptr, gamma_ptr, res_ptr,
                 out_ptr, part_ptr, rmean_ptr, rvar_ptr, bn_weight_ptr,
                 bn_bias_ptr, N, H, W, C, tiles, eps,
                 GELU: tl.constexpr, NORMED: tl.constexpr,
                 RUNNING: tl.constexpr, RESIDUAL: tl.constexpr,
                 MOMENTS: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_C: tl.constexpr):
        """One program: one image's tile of tokens (axis 0) and block of
        channels (axis 1). With GELU: ``a = GELU(conv(src) + bias)`` and,
        with MOMENTS, the tile's mean and M2 of ``a`` per channel. With
        NORMED: ``gamma * (conv(src * scale + shift) + bias)``, the
        BatchNorm's scale and shift read from ``stats`` or, with RUNNING,
        computed from its running mean and variance, weight, bias and
        ``eps`` (inference: no ``_statistics`` launch), plus the residual
        with RESIDUAL."""
        pid, rn, rc, cmask = _tile(tiles, C, BLOCK_N, BLOCK_C)
        base = (pid // tiles).to(tl.int64) * N * C  # a batch may pass 2^31
        if RUNNING:
            mean, var = _running(rmean_ptr, rvar_ptr, rc, cmask)
            _, scale, shift = _coefficients(bn_weight_ptr, bn_bias_ptr,
                                            mean, var, eps, rc, cmask)
        elif NORMED:
            scale, shift = _stats(stats_ptr, 2, rc, cmask, C)
        else:
            scale = tl.zeros((BLOCK_C,), dtype=tl.float32)
            shift = scale
        acc = _conv3x3(src_ptr + base, w_ptr, scale, shift, rn, rc, cmask,
                       N, H, W, C, AFFINE=NORMED, FLIP=False,
                       BLOCK_N=BLOCK_N, BLOCK_C=BLOCK_C)
        acc += tl.load(bias_ptr + rc, mask=cmask, other=0.).to(
            tl.float32)[None, :]
        if GELU:
            acc = 0.5 * acc * (1 + tl.math.erf(acc * 0.7071067811865476))
        if NORMED:
            acc *= tl.load(gamma_ptr + rc, mask=cmask, other=0.).to(
                tl.float32)[None, :]
        mask = (rn < N)[:, None] & cmask[None, :]
        offsets = base + rn[:, None] * C + rc[None, :]
        if RESIDUAL:
            acc += tl.load(res_ptr + offsets, mask=mask,
                           other=0.).to(tl.float32)
        out = acc.to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + offsets, out, mask=mask)
        if MOMENTS:  # of the values stored, which the norm will read
            a = tl.where(mask, out.to(tl.float32), 0.)
            count = tl.sum((rn < N).to(tl.float32), axis=0)
            mean = tl.sum(a, axis=0) / count
            dev = tl.where(mask, a - mean[None, :], 0.)
            tl.store(part_ptr + pid * 2 * C + rc, mean, mask=cmask)
            tl.store(part_ptr + pid * 2 * C + C + rc,
                     tl.sum(dev * dev, axis=0), mask=cmask)

    @triton.jit
    def _moments(part_ptr, part, parts, tiles, N, rc, cmask, C,
                 BLOCK_N: tl.constexpr):
        """Tiles ``part``'s token counts, means and M2 (zeros past
        ``parts``)."""
        exists = part < parts
        tile = part % tiles
        n = tl.where(exists, tl.minimum(BLOCK_N, N - tile * BLOCK_N), 0)
        m = exists[:, None] & cmask[None, :]
        offsets = part[:, None] * 2 * C + rc[None, :]
        means = tl.load(part_ptr + offsets, mask=m, other=0.)
        m2s = tl.load(part_ptr + offsets + C, mask=m, other=0.)
        return n.to(tl.float32), means, m2s

    @triton.jit
    def _statistics(part_ptr, weight_ptr, bias_ptr, rmean_ptr, rvar_ptr,
                    stats_ptr, N, C, tiles, parts, count, factor, eps,
                    BATCH: tl.constexpr, UPDATE: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
                    CHUNK: tl.constexpr):
        """One program: a block of channels. The mean and variance (BATCH:
        from the tiles' means and M2, ``CHUNK`` tiles at a time: the mean
        of their means, then the sum of their M2 and of their means'
        squared deviations from it; otherwise the running ones), with
        UPDATE the running averages moved by ``factor`` towards
        the batch's (the variance unbiased, as nn.BatchNorm2d does), and
        ``stats`` = (mean, 1 / std, scale, shift, variance) for the
        norm."""
        rc = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
        cmask = rc < C
        if BATCH:
            rp = tl.arange(0, CHUNK)
            total = tl.zeros((BLOCK_C,), dtype=tl.float32)
            for first in range(0, parts, CHUNK):
                n, means, _ = _moments(part_ptr, first + rp, parts, tiles,
                                       N, rc, cmask, C, BLOCK_N)
                total += tl.sum(n[:, None] * means, axis=0)
            mean = total / count
            m2 = tl.zeros((BLOCK_C,), dtype=tl.float32)
            for first in range(0, parts, CHUNK):
                n, means, m2s = _moments(part_ptr, first + rp, parts, tiles,
                                         N, rc, cmask, C, BLOCK_N)
                dev = means - mean[None, :]
                m2 += tl.sum(m2s + n[:, None] * dev * dev, axis=0)
            var = m2 / count
            if UPDATE:
                rmean, rvar = _running(rmean_ptr, rvar_ptr, rc, cmask)
                tl.store(rmean_ptr + rc, (1 - factor) * rmean + factor * mean,
                         mask=cmask)
                tl.store(rvar_ptr + rc, (1 - factor) * rvar +
                         factor * var * (count / (count - 1)), mask=cmask)
        else:
            mean, var = _running(rmean_ptr, rvar_ptr, rc, cmask)
        rstd, scale, shift = _coefficients(weight_ptr, bias_ptr, mean, var,
                                           eps, rc, cmask)
        tl.store(stats_ptr + rc, mean, mask=cmask)
        tl.store(stats_ptr + C + rc, rstd, mask=cmask)
        tl.store(stats_ptr + 2 * C + rc, scale, mask=cmask)
        tl.store(stats_ptr + 3 * C + rc, shift, mask=cmask)
        tl.store(stats_ptr + 4 * C + rc, var, mask=cmask)

    @triton.jit
    def _backward(grad_ptr, w_ptr, gamma_ptr, src_ptr, stats_ptr, dsrc_ptr,
                  part_ptr, N, H, W, C, tiles, NORMED: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
        """One program: one image's tile of tokens and block of channels.
        For a convolution ``out = conv(s) + bias`` (NORMED: ``gamma * (...)``
        with ``s`` the BatchNorm's output from ``src``): ``dsrc`` the
        gradient of ``s``, and the tile's sums of ``grad(p) s(p + o_k)``
        for each tap, of ``grad`` (the bias's) and, with NORMED, of
        ``dsrc`` and ``dsrc (src - mean) / std`` (BatchNorm's)."""
        pid, rn, rc, cmask = _tile(tiles, C, BLOCK_N, BLOCK_C)
        base = (pid // tiles).to(tl.int64) * N * C  # a batch may pass 2^31
        scale, shift = _stats(stats_ptr, 2, rc, cmask, C)
        ds = _conv3x3(grad_ptr + base, w_ptr, scale, shift, rn, rc, cmask, N,
                      H, W, C, AFFINE=False, FLIP=True, BLOCK_N=BLOCK_N,
                      BLOCK_C=BLOCK_C)
        if NORMED:
            ds *= tl.load(gamma_ptr + rc, mask=cmask, other=0.).to(
                tl.float32)[None, :]
        mask = (rn < N)[:, None] & cmask[None, :]
        offsets = base + rn[:, None] * C + rc[None, :]
        grad = tl.load(grad_ptr + offsets, mask=mask, other=0.).to(
            tl.float32)
        # the (SUMS, tiles, C) sums: this tile's of row r at sums + r * row
        sums = part_ptr + pid * C + rc
        row = tl.num_programs(0) * C
        for di in tl.static_range(3):
            for dj in tl.static_range(3):
                idx, on_grid = _neighbours(rn, N, H, W, di - 1, dj - 1)
                m = on_grid[:, None] & cmask[None, :]
                s = tl.load(src_ptr + base + idx[:, None] * C + rc[None, :],
                            mask=m, other=0.).to(tl.float32)
                if NORMED:
                    s = tl.where(m, s * scale[None, :] + shift[None, :], 0.)
                tl.store(sums + (di * 3 + dj) * row, tl.sum(grad * s, axis=0),
                         mask=cmask)
        tl.store(sums + 9 * row, tl.sum(grad, axis=0), mask=cmask)
        if NORMED:
            mean, rstd = _stats(stats_ptr, 0, rc, cmask, C)
            a = tl.load(src_ptr + offsets, mask=mask, other=0.).to(
                tl.float32)
            normed = tl.where(mask, (a - mean[None, :]) * rstd[None, :], 0.)
            ds = tl.where(mask, ds, 0.)
            tl.store(sums + 10 * row, tl.sum(ds, axis=0), mask=cmask)
            tl.store(sums + 11 * row, tl.sum(ds * normed, axis=0),
                     mask=cmask)
        tl.store(dsrc_ptr + offsets, ds.to(dsrc_ptr.dtype.element_ty),
                 mask=mask)

    @triton.jit
    def _gelu_backward(dz_ptr, a_ptr, y_ptr, w_ptr, bias_ptr, coef_ptr,
                       out_ptr, N, H, W, C, tiles, BLOCK_N: tl.constexpr,
                       BLOCK_C: tl.constexpr):
        """One program: one image's tile of tokens and block of channels.
        The gradient of ``conv1(y) + bias`` from ``dz``, that of the norm's
        output: ``(alpha dz + beta a + c) GELU'(conv1(y) + bias)``, with
        BatchNorm's backward in the per-channel (alpha, beta, c)."""
        pid, rn, rc, cmask = _tile(tiles, C, BLOCK_N, BLOCK_C)
        base = (pid // tiles).to(tl.int64) * N * C  # a batch may pass 2^31
        pre = _conv3x3(y_ptr + base, w_ptr, rc, rc, rn, rc, cmask, N, H, W,
                       C, AFFINE=False, FLIP=False, BLOCK_N=BLOCK_N,
                       BLOCK_C=BLOCK_C)
        pre += tl.load(bias_ptr + rc, mask=cmask, other=0.).to(
            tl.float32)[None, :]
        cdf = 0.5 * (1 + tl.math.erf(pre * 0.7071067811865476))
        pdf = tl.exp(-0.5 * pre * pre) * 0.3989422804014327
        mask = (rn < N)[:, None] & cmask[None, :]
        offsets = base + rn[:, None] * C + rc[None, :]
        dz = tl.load(dz_ptr + offsets, mask=mask, other=0.)
        a = tl.load(a_ptr + offsets, mask=mask, other=0.).to(tl.float32)
        alpha = tl.load(coef_ptr + rc, mask=cmask, other=0.)
        beta = tl.load(coef_ptr + C + rc, mask=cmask, other=0.)
        c = tl.load(coef_ptr + 2 * C + rc, mask=cmask, other=0.)
        da = alpha[None, :] * dz + beta[None, :] * a + c[None, :]
        tl.store(out_ptr + offsets, da * (cdf + pre * pdf), mask=mask)

    @triton.jit
    def _tiles_sum(sums_ptr, row, parts, rc, cmask, C,
                   CHUNK: tl.constexpr, BLOCK_C: tl.constexpr):
        """Row ``row`` of ``_backward``'s (rows, parts, C) sums added over
        the tiles, ``CHUNK`` tiles at a time."""
        rp = tl.arange(0, CHUNK)
        total = tl.zeros((BLOCK_C,), dtype=tl.float32)
        for first in range(0, parts, CHUNK):
            part = first + rp
            m = (part < parts)[:, None] & cmask[None, :]
            total += tl.sum(tl.load(
                sums_ptr + (row * parts + part[:, None]) * C + rc[None, :],
                mask=m, other=0.), axis=0)
        return total

    @triton.jit
    def _parameter_gradients(sums_ptr, parts, w_ptr, bias_ptr, gamma_ptr,
                             stats_ptr, dw_ptr, db_ptr, dgamma_ptr,
                             totals_ptr, coef_ptr, C, count,
                             NORMED: tl.constexpr, BATCH: tl.constexpr,
                             CHUNK: tl.constexpr, BLOCK_C: tl.constexpr):
        """One program: a block of channels. Adds ``_backward``'s sums over
        the tiles and writes a convolution's weight (``dw``, in its (C, 1,
        3, 3) layout) and bias gradients; with NORMED (conv2, ``gamma *
        (conv2(z) + b2)``) times ``gamma``, the layer scale's gradient,
        BatchNorm's two sums (``totals``: of dz, of dz times the normalised
        input) and the coefficients of its backward for ``_gelu_backward``
        (BATCH: with the batch statistics' own gradient)."""
        rc = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
        cmask = rc < C
        if NORMED:
            gamma = tl.load(gamma_ptr + rc, mask=cmask, other=0.).to(
                tl.float32)
        else:
            gamma = tl.full((BLOCK_C,), 1., dtype=tl.float32)
        dgamma = tl.zeros((BLOCK_C,), dtype=tl.float32)
        for k in tl.static_range(9):
            tap = _tiles_sum(sums_ptr, k, parts, rc, cmask, C, CHUNK, BLOCK_C)
            tl.store(dw_ptr + rc * 9 + k, tap * gamma, mask=cmask)
            if NORMED:
                dgamma += tap * tl.load(w_ptr + rc * 9 + k, mask=cmask,
                                        other=0.).to(tl.float32)
        bias_sum = _tiles_sum(sums_ptr, 9, parts, rc, cmask, C, CHUNK,
                              BLOCK_C)
        tl.store(db_ptr + rc, bias_sum * gamma, mask=cmask)
        if NORMED:
            bias = tl.load(bias_ptr + rc, mask=cmask, other=0.).to(
                tl.float32)
            tl.store(dgamma_ptr + rc, dgamma + bias * bias_sum, mask=cmask)
            sum_dz = _tiles_sum(sums_ptr, 10, parts, rc, cmask, C, CHUNK,
                                BLOCK_C)
            sum_dz_normed = _tiles_sum(sums_ptr, 11, parts, rc, cmask, C,
                                       CHUNK, BLOCK_C)
            tl.store(totals_ptr + rc, sum_dz, mask=cmask)
            tl.store(totals_ptr + C + rc, sum_dz_normed, mask=cmask)
            mean, rstd = _stats(stats_ptr, 0, rc, cmask, C)
            scale = tl.load(stats_ptr + 2 * C + rc, mask=cmask, other=0.)
            if BATCH:  # the batch's mean and variance depend on a too
                beta = -scale * rstd * sum_dz_normed / count
                shift = -scale * sum_dz / count - beta * mean
            else:
                beta = tl.zeros((BLOCK_C,), dtype=tl.float32)
                shift = beta
            tl.store(coef_ptr + rc, scale, mask=cmask)
            tl.store(coef_ptr + C + rc, beta, mask=cmask)
            tl.store(coef_ptr + 2 * C + rc, shift, mask=cmask)


def _grid(B: int, N: int, C: int) -> Tuple[int, Tuple[int, int]]:
    """Tiles of tokens per image, and the grid of one image's tile and one
    block of channels per program."""
    tiles = triton.cdiv(N, BLOCK_N)
    return tiles, (B * tiles, triton.cdiv(C, BLOCK_C))


def _statistics_of(moments: torch.Tensor, B: int, N: int, C: int,
                   weight: torch.Tensor, bias: torch.Tensor,
                   running_mean: Optional[torch.Tensor],
                   running_var: Optional[torch.Tensor], eps: float,
                   batch: bool, factor: Optional[float],
                   group: Optional['dist.ProcessGroup']
                   ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The norm's (5, C) statistics (mean, 1 / std, scale, shift, variance)
    and, synchronised over ``group``, the count of values per channel they
    are of (a tensor: no wait for the GPU). ``batch``: from the tiles'
    ``moments``, over every process of ``group`` where given (SyncBN: each
    process's mean, variance and count gathered and combined), the running
    averages moved by ``factor`` if given; else the running ones."""
    stats = moments.new_empty((5, C))
    count = float(B * N)
    update = factor is not None and group is None
    _statistics[(triton.cdiv(C, BLOCK_C),)](
        moments, weight, bias,
        running_mean if running_mean is not None else stats,
        running_var if running_var is not None else stats, stats, N, C,
        triton.cdiv(N, BLOCK_N), moments.shape[0] if batch else 0, count,
        factor if update else 0., eps, BATCH=batch, UPDATE=update,
        BLOCK_N=BLOCK_N, BLOCK_C=BLOCK_C, CHUNK=_CHUNK)
    if group is None:
        return stats, None
    local = torch.cat([stats[0], stats[4], stats.new_full((1,), count)])
    gathered = [torch.empty_like(local)
                for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, local, group=group)
    gathered = torch.stack(gathered)
    means, variances, counts = gathered[:, :C], gathered[:, C:2 * C], \
        gathered[:, 2 * C:]
    count = counts.sum()
    mean = (means * counts).sum(0) / count
    var = ((variances + (means - mean) ** 2) * counts).sum(0) / count
    if factor is not None:
        running_mean.lerp_(mean, factor)
        running_var.lerp_(var * (count / (count - 1)), factor)
    _statistics[(triton.cdiv(C, BLOCK_C),)](
        moments, weight, bias, mean, var, stats, N, C, 1, 0, 1., 0., eps,
        BATCH=False, UPDATE=False, BLOCK_N=BLOCK_N, BLOCK_C=BLOCK_C,
        CHUNK=_CHUNK)
    return stats, count


class _LocalInteraction(torch.autograd.Function):
    """(B, N, C) tokens of an H x W grid -> ``residual + gamma *
    conv2(BN(GELU(conv1(y))))``: three kernels forward (the norm's
    statistics, batch or running, between the two convolutions; two where
    the running ones normalise and no gradient is asked for, the second
    convolution reading them itself), five backward. A recorded backward
    differentiates :func:`_reference` (:mod:`.higher_order`)."""

    @staticmethod
    def forward(ctx, y, residual, w1, b1, w2, b2, bn_weight, bn_bias, gamma,
                running_mean, running_var, H, W, eps, batch, factor, group,
                recorded):
        B, N, C = y.shape
        tiles, grid = _grid(B, N, C)
        a = torch.empty_like(y)
        moments = y.new_empty((B * tiles, 2, C) if batch else (1,),
                              dtype=torch.float32)
        _forward[grid](y, w1, b1, y, gamma, y, a, moments, y, y, y, y, N, H,
                       W, C, tiles, eps, GELU=True, NORMED=False,
                       RUNNING=False, RESIDUAL=False, MOMENTS=batch,
                       BLOCK_N=BLOCK_N, BLOCK_C=BLOCK_C, num_warps=TILE_WARPS)
        # (needs_input_grad says requires_grad, also under no_grad)
        running = not batch and not (recorded and any(ctx.needs_input_grad))
        if running:  # inference: the second convolution reads them
            stats, synced = y, None
        else:
            stats, synced = _statistics_of(
                moments, B, N, C, bn_weight, bn_bias, running_mean,
                running_var, eps, batch, factor, group)
        dtype = residual.dtype if residual is not None else y.dtype
        out = y.new_empty((B, N, C), dtype=dtype)
        _forward[grid](a, w2, b2, stats, gamma,
                       residual if residual is not None else y, out, stats,
                       running_mean if running else y,
                       running_var if running else y,
                       bn_weight, bn_bias, N, H, W, C, tiles, eps,
                       GELU=False, NORMED=True, RUNNING=running,
                       RESIDUAL=residual is not None, MOMENTS=False,
                       BLOCK_N=BLOCK_N, BLOCK_C=BLOCK_C, num_warps=TILE_WARPS)
        if running:
            return out  # no backward
        ctx.save_for_backward(y, a, w1, b1, w2, b2, gamma, stats, bn_weight,
                              bn_bias)
        ctx.grid = H, W, batch, residual is not None
        ctx.sync = group, synced
        ctx.norm = eps, None if batch else (running_mean, running_var)
        return out

    @staticmethod
    def backward(ctx, dout):
        if higher_order.recorded():
            return _recorded_backward(ctx, dout)
        y, a, w1, b1, w2, b2, gamma, stats, _, _ = ctx.saved_tensors
        H, W, batch, residual = ctx.grid
        B, N, C = y.shape
        tiles, grid = _grid(B, N, C)
        dout = dout.contiguous()
        dz = torch.empty_like(y, dtype=torch.float32)
        sums2 = y.new_empty((_SUMS, B * tiles, C), dtype=torch.float32)
        _backward[grid](dout, w2, gamma, a, stats, dz, sums2, N, H, W, C,
                        tiles, NORMED=True, BLOCK_N=BLOCK_N,
                        BLOCK_C=BLOCK_C, num_warps=TILE_WARPS)
        group, synced = ctx.sync
        count = float(B * N)
        dw2, dw1 = torch.empty_like(w2), torch.empty_like(w1)
        db2, db1, dgamma = (b2.new_empty(C, dtype=torch.float32)
                            for _ in range(3))
        totals = y.new_empty((2, C), dtype=torch.float32)
        coef = y.new_empty((3, C), dtype=torch.float32)
        channels = (triton.cdiv(C, _REDUCE_C),)
        _parameter_gradients[channels](
            sums2, B * tiles, w2, b2, gamma, stats, dw2, db2, dgamma, totals,
            coef, C, count, NORMED=True, BATCH=batch, CHUNK=_CHUNK,
            BLOCK_C=_REDUCE_C)
        if batch and group is not None:  # SyncBN: every process's batch
            reduced = totals.clone()
            dist.all_reduce(reduced, group=group)
            mean, rstd, scale = stats[:3]
            beta = -scale * rstd * reduced[1] / synced
            coef = torch.stack([scale, beta,
                                -scale * reduced[0] / synced - beta * mean])
        dpre = torch.empty_like(dz)
        _gelu_backward[grid](dz, a, y, w1, b1, coef, dpre, N, H, W, C, tiles,
                             BLOCK_N=BLOCK_N, BLOCK_C=BLOCK_C,
                             num_warps=TILE_WARPS)
        dy = torch.empty_like(y)
        _backward[grid](dpre, w1, gamma, y, stats, dy, sums2, N, H, W, C,
                        tiles, NORMED=False, BLOCK_N=BLOCK_N,
                        BLOCK_C=BLOCK_C, num_warps=TILE_WARPS)
        _parameter_gradients[channels](
            sums2, B * tiles, w1, b1, gamma, stats, dw1, db1, dgamma, totals,
            coef, C, count, NORMED=False, BATCH=False, CHUNK=_CHUNK,
            BLOCK_C=_REDUCE_C)
        # BatchNorm's parameters: this process's sums (DDP adds them up)
        return (dy, dout if residual else None, dw1, db1.to(b1.dtype), dw2,
                db2.to(b2.dtype), totals[1], totals[0],
                dgamma.to(gamma.dtype), None, None, None, None, None, None,
                None, None, None)


def _recorded_backward(ctx, dout: torch.Tensor) -> tuple:
    """:class:`_LocalInteraction`'s gradients, recorded: :func:`_reference`
    differentiated; the residual's gradient is ``dout``."""
    y, _, w1, b1, w2, b2, gamma, _, bn_weight, bn_bias = ctx.saved_tensors
    H, W, _, residual = ctx.grid
    if ctx.sync[0] is not None:
        raise RuntimeError(
            "Second derivatives of LPI's kernels are not computed for a "
            'SyncBatchNorm that synchronises across processes; run the '
            'branch without them (fast_path=False) or with a BatchNorm of '
            'its own per process (norm_cfg=dict(type="BN")).')
    eps, running = ctx.norm
    need = ctx.needs_input_grad
    grads = higher_order.gradients(
        lambda y, w1, b1, w2, b2, bn_weight, bn_bias, gamma: _reference(
            y, w1, b1, w2, b2, bn_weight, bn_bias, gamma, H, W, eps, running,
            dout.dtype),
        (y, w1, b1, w2, b2, bn_weight, bn_bias, gamma),
        (need[0], *need[2:9]), dout)
    dy, dw1, db1, dw2, db2, dbn_weight, dbn_bias, dgamma = grads
    return (dy, dout if residual and need[1] else None, dw1, db1, dw2, db2,
            dbn_weight, dbn_bias, dgamma, *[None] * 9)


def _reference(y, w1, b1, w2, b2, bn_weight, bn_bias, gamma, H, W, eps,
               running, dtype):
    """What :class:`_LocalInteraction` computes, before the residual, as
    timm's LPI does on an NCHW copy of the tokens (in fp32, as the kernels
    accumulate; the result in ``dtype``): normalised by the batch's
    statistics, or by ``running`` (mean, variance) where given."""
    B, N, C = y.shape
    x = y.float().transpose(1, 2).reshape(B, C, H, W)
    x = F.gelu(F.conv2d(x, w1.float(), b1.float(), padding=1, groups=C))
    mean, var = running if running is not None else (None, None)
    x = F.batch_norm(x, mean, var, bn_weight.float(), bn_bias.float(),
                     training=running is None, eps=eps)
    x = F.conv2d(x, w2.float(), b2.float(), padding=1, groups=C)
    return (gamma.float() * x.flatten(2).transpose(1, 2)).to(dtype)


def batch_norm_mode(bn: nn.BatchNorm2d
                    ) -> Tuple[bool, Optional[float],
                               Optional['dist.ProcessGroup']]:
    """What ``bn`` does now, as its forward decides it: whether it
    normalises with the batch's statistics, the factor by which its running
    averages move (None: they stay), counting the batch in
    ``num_batches_tracked``, and for an ``nn.SyncBatchNorm`` that
    synchronises (training, distributed over several processes) its process
    group."""
    factor = None
    if bn.training and bn.track_running_stats:
        bn.num_batches_tracked.add_(1)
        factor = 1 / float(bn.num_batches_tracked) \
            if bn.momentum is None else bn.momentum
    batch = bn.training or bn.running_mean is None
    return batch, factor, synchronising_group(bn)


def synchronising_group(bn: nn.BatchNorm2d
                        ) -> Optional['dist.ProcessGroup']:
    """The process group over which ``bn`` synchronises its statistics now:
    an ``nn.SyncBatchNorm`` in training, distributed over several
    processes; else None."""
    if type(bn) is not nn.SyncBatchNorm or not bn.training or \
            not dist.is_available() or not dist.is_initialized():
        return None
    group = bn.process_group or dist.group.WORLD
    return group if dist.get_world_size(group) > 1 else None


def local_interaction(y: torch.Tensor, H: int, W: int, conv1: nn.Conv2d,
                      bn: nn.BatchNorm2d, conv2: nn.Conv2d,
                      gamma: Optional[torch.Tensor] = None,
                      residual: Optional[torch.Tensor] = None
                      ) -> torch.Tensor:
    """``conv2(bn(GELU(conv1(y))))`` of (B, N, C) tokens ``y`` of an H x W
    grid (depth-wise 3x3 convolutions, zero padding 1), times ``gamma`` and
    plus ``residual`` where given; ``bn`` (``nn.BatchNorm2d`` or
    ``nn.SyncBatchNorm``) normalises and updates its running averages as in
    its own forward."""
    C = y.shape[-1]
    batch, factor, group = batch_norm_mode(bn)

    def given(t: Optional[torch.Tensor], value: float) -> torch.Tensor:
        return t if t is not None else y.new_full((C,), value,
                                                  dtype=torch.float32)
    with triton_support.on_device(y):
        return _LocalInteraction.apply(
            y.contiguous(), residual.contiguous() if residual is not None
            else None, conv1.weight.contiguous(), given(conv1.bias, 0.),
            conv2.weight.contiguous(), given(conv2.bias, 0.),
            given(bn.weight, 1.), given(bn.bias, 0.), given(gamma, 1.),
            bn.running_mean, bn.running_var, H, W, bn.eps, batch, factor,
            group, torch.is_grad_enabled())


def probe(device: torch.device, dtype: torch.dtype, channels: int,
          batch: bool, update: bool, residual_dtype: torch.dtype,
          backward: bool, synced: bool = False) -> None:
    """The kernels on a tiny input (``channels`` channels, a 2 x 3 grid),
    with and without a residual of ``residual_dtype``, BatchNorm on the
    ``batch`` statistics (or its running ones), ``update``-ing its running
    ones; and ``backward``. ``synced`` (SyncBN over several processes):
    also the statistics kernel's variants that combine the processes'
    statistics (the batch's without an update, then given ones), which a
    single process reaches with BatchNorm without running statistics and
    in eval mode."""
    conv1, conv2 = (nn.Conv2d(channels, channels, 3, padding=1,
                              groups=channels).to(device) for _ in range(2))
    y = torch.randn(1, 6, channels, device=device, dtype=dtype,
                    requires_grad=backward)
    residual = torch.randn(1, 6, channels, device=device,
                           dtype=residual_dtype, requires_grad=backward)
    modes = [(batch, update)] + ([(True, False), (False, False)]
                                 if synced else [])
    for batch, update in modes:
        bn = nn.BatchNorm2d(channels, track_running_stats=update or not batch)
        bn.to(device).train(batch)
        for res in (None, residual):
            out = local_interaction(y, 2, 3, conv1, bn, conv2, residual=res)
            if backward and (batch, update) == modes[0]:
                torch.autograd.grad(out.float().sum(),
                                    [y, *conv1.parameters()])


def works(device: torch.device, dtype: torch.dtype, bn: nn.BatchNorm2d,
          residual_dtype: torch.dtype) -> bool:
    """The kernels compile and run on ``device`` for ``dtype`` tokens of
    ``bn``'s channels, normalised as ``bn`` normalises now, a residual of
    ``residual_dtype`` or none, and gradients if they are recorded now
    (probed once per variant, see :func:`.triton_support.works`)."""
    return triton_support.works(
        "LPI", device, dtype, probe, channels=bn.num_features,
        batch=bn.training or bn.running_mean is None,
        update=bn.training and bn.track_running_stats,
        residual_dtype=residual_dtype, backward=torch.is_grad_enabled(),
        synced=synchronising_group(bn) is not None)
