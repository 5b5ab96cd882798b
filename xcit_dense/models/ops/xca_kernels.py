"""XCA's attention core in Triton kernels, forward and backward: what XCA's
straightforward computation does between its ``qkv`` and ``proj`` linear
layers, in three kernels each way instead of about a dozen.
One concept in one file, kernels beside the autograd function that launches
them, though longer than the package's other files.

For (B, N, 3C) ``qkv`` (the ``qkv`` layer's output), each image and head,
with q, k, v the head's (N x d) slices::

    S = q^T k,  s_q = |q_c|^2,  s_k = |k_c|^2            (sums over tokens)
    A = softmax(S / (max(|q_c|, eps) max(|k_c|, eps)^T) * t)         (d x d)
    out = v A^T                                      (N x d, into (B, N, C))

which is F.normalize's cosine attention of timm's ``XCA`` (``S`` over the
norms is the product of the normalised q and k), so the normalised q and k
are never materialised. Forward: ``_token_products`` sums ``S`` and the
squares over ranges of tokens, one program per range; ``_attention`` adds
the ranges' sums and forms ``A``, one program per image and head;
``_attend`` writes each tile's ``v A^T`` straight into the (B, N, C) layout
the output projection reads. Backward: ``dA = sum_n dout^T v`` by the same
``_token_products``; ``_score_gradients`` adds the ranges' sums and takes
them back through the softmax, the temperature and the normalisation on
the d x d matrices (once per image and head); ``_token_gradients`` writes
each tile's ``dq = k dS^T + 2 q ds_q``, ``dk = q dS + 2 k ds_k`` and ``dv =
dout A`` into one (B, N, 3C) gradient. The d x d work is done once per
image and head, not repeated in every tile's program.

Products are accumulated in fp32 whatever the input's dtype (fp16 or bf16
under autocast, whose dtype the output and ``qkv``'s gradient keep); fp32
inputs use TF32 exactly when ``torch.backends.cuda.matmul.allow_tf32``
allows it. Triton compiles for CUDA; ``TRITON_INTERPRET=1`` (set before
Triton is imported) runs the same kernels on CPU tensors, as the tests do.
"""
from typing import Tuple

import torch
import torch.nn.functional as F

from . import higher_order, triton_support
from .triton_support import available, tl, triton  # noqa: F401 (available)

#: F.normalize's eps on the channels' L2 norms over the tokens
EPS = 1e-12
#: tokens per tile of the token sums, and per program of them (a multiple)
BLOCK_N = 64
TOKENS_PER_PROGRAM = 512
#: tokens per tile and warps per program of ``_attend`` and
#: ``_token_gradients``, by ``tl.dot``'s precision. IEEE fp32 products run
#: on the CUDA cores, whose operand layouts take many more registers than
#: the tensor cores' (TF32): at 64 tokens over 4 warps the fp32 kernels
#: spilled (about 15 KB per thread in the backward); 32 over 8 warps compile
#: without local memory for sm_80 and sm_90 (``tools/compile_kernels.py``).
TILES = {'ieee': (32, 8), 'tf32': (64, 4)}


if triton is not None:

    @triton.jit
    def _head(H, D, BLOCK_D: tl.constexpr):
        """This program's image and head (axis 0: ``b * H + h``): ``bh``,
        ``b`` (64-bit: a batch's offsets may pass 2^31), ``h``, the offsets
        of the head's ``D`` channels in a block of ``BLOCK_D`` and which of
        them exist."""
        bh = tl.program_id(0)
        rd = tl.arange(0, BLOCK_D)
        return bh, (bh // H).to(tl.int64), bh % H, rd, rd < D

    @triton.jit
    def _square(rd, dmask, D):
        """The offsets of a row-major D x D matrix over the channel block
        ``rd``, and which of them exist."""
        return rd[:, None] * D + rd[None, :], dmask[:, None] & dmask[None, :]

    @triton.jit
    def _token_products(a_ptr, b_ptr, prod_ptr, sq_ptr, N, H, D,
                        stride_ab, stride_an, stride_bb, stride_bn,
                        tokens_per_program,
                        SQUARES: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
        """One program: image ``b``, head ``h`` (axis 0) and one range of
        tokens (axis 1). Writes ``sum_n a_n^T b_n`` (D x D) of the head's
        slices of ``a`` and ``b`` over that range and, with ``SQUARES``, the
        sums of their squares (2 x D), to its own partial slot."""
        bh, b, h, rd, dmask = _head(H, D, BLOCK_D)
        part = tl.program_id(1)
        parts = tl.num_programs(1)
        a_base = a_ptr + b * stride_ab + h * D
        b_base = b_ptr + b * stride_bb + h * D
        acc = tl.zeros((BLOCK_D, BLOCK_D), dtype=tl.float32)
        sq_a = tl.zeros((BLOCK_D,), dtype=tl.float32)
        sq_b = tl.zeros((BLOCK_D,), dtype=tl.float32)
        start = part * tokens_per_program
        end = tl.minimum(start + tokens_per_program, N)
        for n0 in range(start, end, BLOCK_N):
            rn = n0 + tl.arange(0, BLOCK_N)
            mask = (rn < end)[:, None] & dmask[None, :]
            a = tl.load(a_base + rn[:, None] * stride_an + rd[None, :],
                        mask=mask, other=0.).to(tl.float32)
            bt = tl.load(b_base + rn[:, None] * stride_bn + rd[None, :],
                         mask=mask, other=0.).to(tl.float32)
            acc = tl.dot(tl.trans(a), bt, acc, input_precision=PRECISION)
            if SQUARES:
                sq_a += tl.sum(a * a, axis=0)
                sq_b += tl.sum(bt * bt, axis=0)
        slot = bh * parts + part
        square, mmask = _square(rd, dmask, D)
        tl.store(prod_ptr + slot * D * D + square, acc, mask=mmask)
        if SQUARES:
            tl.store(sq_ptr + slot * 2 * D + rd, sq_a, mask=dmask)
            tl.store(sq_ptr + slot * 2 * D + D + rd, sq_b, mask=dmask)

    @triton.jit
    def _sum_parts(ptr, first, PARTS, size, offsets, mask):
        """The sum of the ``PARTS`` blocks of ``size`` values from block
        ``first`` on (``_token_products``' partial sums of one image and
        head), each read at ``offsets``."""
        total = tl.zeros(offsets.shape, dtype=tl.float32)
        for part in range(0, PARTS):
            total += tl.load(ptr + (first + part) * size + offsets, mask=mask,
                             other=0.)
        return total

    @triton.jit
    def _attention(prod_ptr, sq_ptr, t_ptr, attn_ptr, gram_ptr, sqsum_ptr,
                   H, D, PARTS, EPS: tl.constexpr, BLOCK_D: tl.constexpr):
        """One program per image and head: sums ``_token_products``'
        partial ``q^T k`` and squares and forms the attention ``A``
        (normalisation, temperature, softmax over the key channels); writes
        ``A``, and ``q^T k`` and the squares for the backward."""
        bh, _, h, rd, dmask = _head(H, D, BLOCK_D)
        square, mmask = _square(rd, dmask, D)
        gram = _sum_parts(prod_ptr, bh * PARTS, PARTS, D * D, square, mmask)
        sq_q = _sum_parts(sq_ptr, bh * PARTS, PARTS, 2 * D, rd, dmask)
        sq_k = _sum_parts(sq_ptr, bh * PARTS, PARTS, 2 * D, D + rd, dmask)
        norm_q = tl.maximum(tl.sqrt(sq_q), EPS)
        norm_k = tl.maximum(tl.sqrt(sq_k), EPS)
        t = tl.load(t_ptr + h).to(tl.float32)
        logits = gram / (norm_q[:, None] * norm_k[None, :]) * t
        logits = tl.where(dmask[None, :], logits, float('-inf'))
        e = tl.exp(logits - tl.max(logits, axis=1)[:, None])
        attn = e / tl.sum(e, axis=1)[:, None]
        tl.store(attn_ptr + bh * D * D + square, attn, mask=mmask)
        tl.store(gram_ptr + bh * D * D + square, gram, mask=mmask)
        tl.store(sqsum_ptr + bh * 2 * D + rd, sq_q, mask=dmask)
        tl.store(sqsum_ptr + bh * 2 * D + D + rd, sq_k, mask=dmask)

    @triton.jit
    def _attend(qkv_ptr, attn_ptr, out_ptr, N, H, D, stride_b, stride_n,
                stride_ob, stride_on, BLOCK_N: tl.constexpr,
                BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
        """One program: image ``b``, head ``h`` (axis 0), one tile of tokens
        (axis 1). Writes the tile's ``v A^T``."""
        bh, b, h, rd, dmask = _head(H, D, BLOCK_D)
        tile = tl.program_id(1)
        square, mmask = _square(rd, dmask, D)
        attn = tl.load(attn_ptr + bh * D * D + square, mask=mmask, other=0.)
        rn = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rn < N)[:, None] & dmask[None, :]
        v = tl.load(qkv_ptr + b * stride_b + rn[:, None] * stride_n +
                    2 * H * D + h * D + rd[None, :], mask=mask,
                    other=0.).to(tl.float32)
        out = tl.dot(v, tl.trans(attn), input_precision=PRECISION)
        tl.store(out_ptr + b * stride_ob + rn[:, None] * stride_on + h * D +
                 rd[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _score_gradients(dprod_ptr, attn_ptr, gram_ptr, sq_ptr, t_ptr,
                         ds_ptr, dsq_ptr, dt_ptr, H, D, PARTS,
                         EPS: tl.constexpr, BLOCK_D: tl.constexpr):
        """One program per image and head: sums the partial ``dA = sum_n
        dout^T v`` and takes it back through the softmax, the temperature
        and the normalisation; writes ``dS`` (the gradient of ``q^T k``),
        ``ds_q`` and ``ds_k`` (those of the squared norms) and the
        temperature's gradient from this image."""
        bh, _, h, rd, dmask = _head(H, D, BLOCK_D)
        square, mmask = _square(rd, dmask, D)
        dattn = _sum_parts(dprod_ptr, bh * PARTS, PARTS, D * D, square,
                           mmask)
        attn = tl.load(attn_ptr + bh * D * D + square, mask=mmask, other=0.)
        gram = tl.load(gram_ptr + bh * D * D + square, mask=mmask, other=0.)
        sq_q = tl.load(sq_ptr + bh * 2 * D + rd, mask=dmask, other=0.)
        sq_k = tl.load(sq_ptr + bh * 2 * D + D + rd, mask=dmask, other=0.)
        t = tl.load(t_ptr + h).to(tl.float32)
        scale = tl.maximum(tl.sqrt(sq_q), EPS)[:, None] * \
            tl.maximum(tl.sqrt(sq_k), EPS)[None, :]
        cosine = gram / scale
        # softmax; logits = cosine * t; cosine = gram / scale
        dlogits = attn * (dattn - tl.sum(dattn * attn, axis=1)[:, None])
        tl.store(dt_ptr + bh, tl.sum(tl.sum(dlogits * cosine, axis=1),
                                     axis=0))
        tl.store(ds_ptr + bh * D * D + square, dlogits * t / scale,
                 mask=mmask)
        # scale = n_q n_k^T with n = max(sqrt(s), eps): the gradients of
        # log(n_q) and log(n_k), then d log(n) / d s = 1 / (2 s) where the
        # norm is above eps (0 where eps replaced it)
        dlogscale = dlogits * t * cosine
        ds_q = tl.where(tl.sqrt(sq_q) > EPS, -tl.sum(dlogscale, axis=1) /
                        (2 * tl.maximum(sq_q, EPS * EPS)), 0.)
        ds_k = tl.where(tl.sqrt(sq_k) > EPS, -tl.sum(dlogscale, axis=0) /
                        (2 * tl.maximum(sq_k, EPS * EPS)), 0.)
        tl.store(dsq_ptr + bh * 2 * D + rd, ds_q, mask=dmask)
        tl.store(dsq_ptr + bh * 2 * D + D + rd, ds_k, mask=dmask)

    @triton.jit
    def _token_gradients(qkv_ptr, dout_ptr, attn_ptr, ds_ptr, dsq_ptr,
                         dqkv_ptr, N, H, D, stride_b, stride_n, stride_db,
                         stride_dn, BLOCK_N: tl.constexpr,
                         BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
        """One program: image ``b``, head ``h`` (axis 0), one tile of tokens
        (axis 1). Writes the tile's ``dq = k dS^T + 2 q ds_q``, ``dk = q dS
        + 2 k ds_k`` and ``dv = dout A`` into the (B, N, 3C) gradient, which
        has ``qkv``'s strides."""
        bh, b, h, rd, dmask = _head(H, D, BLOCK_D)
        tile = tl.program_id(1)
        C = H * D
        square, mmask = _square(rd, dmask, D)
        ds = tl.load(ds_ptr + bh * D * D + square, mask=mmask, other=0.)
        attn = tl.load(attn_ptr + bh * D * D + square, mask=mmask, other=0.)
        ds_q = tl.load(dsq_ptr + bh * 2 * D + rd, mask=dmask, other=0.)
        ds_k = tl.load(dsq_ptr + bh * 2 * D + D + rd, mask=dmask, other=0.)
        rn = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rn < N)[:, None] & dmask[None, :]
        offsets = b * stride_b + rn[:, None] * stride_n + h * D + rd[None, :]
        q = tl.load(qkv_ptr + offsets, mask=mask, other=0.).to(tl.float32)
        k = tl.load(qkv_ptr + offsets + C, mask=mask,
                    other=0.).to(tl.float32)
        dout = tl.load(dout_ptr + b * stride_db + rn[:, None] * stride_dn +
                       h * D + rd[None, :], mask=mask,
                       other=0.).to(tl.float32)
        dq = tl.dot(k, tl.trans(ds), input_precision=PRECISION) + \
            2 * q * ds_q[None, :]
        dk = tl.dot(q, ds, input_precision=PRECISION) + \
            2 * k * ds_k[None, :]
        dv = tl.dot(dout, attn, input_precision=PRECISION)
        kind = dqkv_ptr.dtype.element_ty
        tl.store(dqkv_ptr + offsets, dq.to(kind), mask=mask)
        tl.store(dqkv_ptr + offsets + C, dk.to(kind), mask=mask)
        tl.store(dqkv_ptr + offsets + 2 * C, dv.to(kind), mask=mask)


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's precision for fp32 products of ``dtype`` inputs: IEEE fp32
    unless PyTorch allows TF32 in fp32 matmuls; TF32 for fp16 and bf16
    inputs (whose mantissas it holds)."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return 'ieee'
    return 'tf32'


def _block_d(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


def token_products(a: torch.Tensor, b: torch.Tensor, heads: int, d: int,
                   squares: bool
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per image and head of (B, N, >= heads * d) ``a`` and ``b`` (head
    ``h``'s d channels at ``h * d`` of each token, channels contiguous), in
    fp32 and by ranges of tokens (``parts``): ``sum_n a_n^T b_n``
    (B * heads, parts, d, d) and, with ``squares``, the sums of the squares
    of both (B * heads, parts, 2, d)."""
    B, N = a.shape[:2]
    parts = triton.cdiv(N, TOKENS_PER_PROGRAM)
    prod = a.new_empty((B * heads, parts, d, d), dtype=torch.float32)
    sq = a.new_empty((B * heads, parts, 2, d) if squares else (1,),
                     dtype=torch.float32)
    _token_products[(B * heads, parts)](
        a, b, prod, sq, N, heads, d, a.stride(0), a.stride(1), b.stride(0),
        b.stride(1), TOKENS_PER_PROGRAM, SQUARES=squares, BLOCK_N=BLOCK_N,
        BLOCK_D=_block_d(d), PRECISION=dot_precision(a.dtype))
    return prod, sq


class _Attention(torch.autograd.Function):
    """(B, N, 3C) qkv, temperature (heads, 1, 1) -> (B, N, C), in three
    kernels each way. A recorded backward differentiates :func:`_reference`
    (:mod:`.higher_order`)."""

    @staticmethod
    def forward(ctx, qkv, temperature, heads):
        B, N, C3 = qkv.shape
        C = C3 // 3
        d = C // heads
        prod, sq = token_products(qkv, qkv[..., C:], heads, d, squares=True)
        out = qkv.new_empty((B, N, C))
        attn, gram = (qkv.new_empty((B, heads, d, d), dtype=torch.float32)
                      for _ in range(2))
        sqsum = qkv.new_empty((B, heads, 2, d), dtype=torch.float32)
        _attention[(B * heads,)](
            prod, sq, temperature, attn, gram, sqsum, heads, d,
            prod.shape[1], EPS=EPS, BLOCK_D=_block_d(d))
        precision = dot_precision(qkv.dtype)
        tile, warps = TILES[precision]
        _attend[(B * heads, triton.cdiv(N, tile))](
            qkv, attn, out, N, heads, d, qkv.stride(0), qkv.stride(1),
            out.stride(0), out.stride(1), BLOCK_N=tile, BLOCK_D=_block_d(d),
            PRECISION=precision, num_warps=warps)
        ctx.save_for_backward(qkv, temperature, attn, gram, sqsum)
        ctx.heads = heads
        return out

    @staticmethod
    def backward(ctx, dout):
        qkv, temperature, attn, gram, sqsum = ctx.saved_tensors
        heads = ctx.heads
        if higher_order.recorded():
            return (*higher_order.gradients(
                lambda q, t: _reference(q, t, heads), (qkv, temperature),
                ctx.needs_input_grad[:2], dout), None)
        B, N, C3 = qkv.shape
        C = C3 // 3
        d = C // heads
        dout = dout.contiguous()
        dprod, _ = token_products(dout, qkv[..., 2 * C:], heads, d,
                                  squares=False)
        dscores = torch.empty_like(gram)
        dsq = torch.empty_like(sqsum)
        dt = qkv.new_empty((B, heads), dtype=torch.float32)
        _score_gradients[(B * heads,)](
            dprod, attn, gram, sqsum, temperature, dscores, dsq, dt, heads,
            d, dprod.shape[1], EPS=EPS, BLOCK_D=_block_d(d))
        dqkv = torch.empty_like(qkv)
        precision = dot_precision(qkv.dtype)
        tile, warps = TILES[precision]
        _token_gradients[(B * heads, triton.cdiv(N, tile))](
            qkv, dout, attn, dscores, dsq, dqkv, N, heads, d, qkv.stride(0),
            qkv.stride(1), dout.stride(0), dout.stride(1), BLOCK_N=tile,
            BLOCK_D=_block_d(d), PRECISION=precision, num_warps=warps)
        dtemperature = dt.sum(0).to(temperature.dtype).view_as(temperature)
        return dqkv, dtemperature, None


def _reference(qkv: torch.Tensor, temperature: torch.Tensor,
               heads: int) -> torch.Tensor:
    """What :class:`_Attention` computes, as timm's XCA does (in fp32, as
    the kernels accumulate, and returned in ``qkv``'s dtype)."""
    B, N, C3 = qkv.shape
    q, k, v = qkv.float().reshape(B, N, 3, heads, C3 // (3 * heads)) \
        .permute(2, 0, 3, 4, 1).unbind(0)
    attn = F.normalize(q, dim=-1, eps=EPS) @ \
        F.normalize(k, dim=-1, eps=EPS).transpose(-2, -1)
    out = (attn * temperature).softmax(dim=-1) @ v
    return out.permute(0, 3, 1, 2).reshape(B, N, C3 // 3).to(qkv.dtype)


def attention(qkv: torch.Tensor, temperature: torch.Tensor,
              heads: int) -> torch.Tensor:
    """XCA's attention core: (B, N, 3C) ``qkv`` and
    the (heads, 1, 1) ``temperature`` -> the (B, N, C) attended values,
    before the output projection."""
    with triton_support.on_device(qkv):
        return _Attention.apply(qkv.contiguous(), temperature, heads)


def probe(device: torch.device, dtype: torch.dtype, head_dim: int,
          backward: bool) -> None:
    """The kernels forward, and ``backward``, on a tiny input: two heads of
    ``head_dim`` channels, 5 tokens."""
    qkv = torch.randn(1, 5, 6 * head_dim, device=device, dtype=dtype,
                      requires_grad=backward)
    temperature = torch.ones(2, 1, 1, device=device, requires_grad=backward)
    out = attention(qkv, temperature, 2)
    if backward:
        torch.autograd.grad(out.float().sum(), (qkv, temperature))


def works(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """The kernels compile and run on ``device`` for ``dtype`` tokens, heads
    of ``head_dim`` channels (the tiles' width), the precision of their
    products now, and gradients if they are recorded now (probed once per
    variant, see :func:`.triton_support.works`)."""
    return triton_support.works(
        "XCA's attention", device, dtype, probe, dot_precision(dtype),
        head_dim=head_dim, backward=torch.is_grad_enabled())
