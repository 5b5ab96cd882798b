"""Cross-covariance attention from the second moments of its input.

XCA's query, key and value are affine in its input ``z`` (N x C tokens):
``q = z W_q^T + b_q``, likewise ``k`` and ``v``. Every channel product the
attention needs then follows from the (C x C) second moments ``G = z^T z``
and the token sums ``s = z^T 1``::

    q^T k   = W_q G W_k^T + (W_q s + N b_q) b_k^T + b_q (W_k s)^T
    |q_c|^2 = (W_q G W_q^T)_cc + b_c (2 (W_q s)_c + N b_c)     (same for k)

so the (d x d per head) attention is formed at C x C cost, and folded with the
value and output projections into one (C x C) matrix per image::

    XCA(z) = z (W_p A W_v)^T + W_p A b_v + b_p,   A block-diagonal (heads).

Two token GEMMs of width C (``G``, three of its four blocks; the output)
instead of four (q, k, v, output projection): fewer multiply-adds once there
are more than about 1.5 C tokens (:func:`pays`: where it was measured
faster). ``G`` is accumulated in fp32, also under
autocast (it feeds a product whose rounding it bounds).
"""
from contextlib import nullcontext
from typing import Callable, ContextManager, Dict, Optional, Tuple

import torch

#: The fewest tokens per channel (N / C, per image) at which XCA from the
#: second moments takes less time than its four token GEMMs, by (half
#: precision, training): its C x C products cost about 3 C^3 multiply-adds
#: per image, which only enough tokens repay, and under autocast its Gram
#: matrix is an fp32 GEMM where the token route's are bf16. Each value is
#: where two measurements both had it faster
#: (``python -m benchmarks.probes.xca_route``).
MIN_TOKENS_PER_CHANNEL: Dict[Tuple[bool, bool], float] = {
    (False, False): 1.5, (False, True): 2.0,
    (True, False): 4.0, (True, True): 2.0}


class _Gram(torch.autograd.Function):
    """``z^T z`` for (B, N, C) ``z``, using its symmetry: three of the four
    (C/2 x C/2) blocks are computed (3/4 of the GEMM), and the gradient is
    one GEMM instead of two (itself differentiable: second derivatives
    follow it)."""

    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        half = z.shape[-1] // 2
        if half < 32:
            return torch.bmm(z.transpose(1, 2), z)
        a, b = z[..., :half], z[..., half:]
        ab = torch.bmm(a.transpose(1, 2), b)
        return torch.cat([
            torch.cat([torch.bmm(a.transpose(1, 2), a), ab], dim=2),
            torch.cat([ab.transpose(1, 2), torch.bmm(b.transpose(1, 2), b)],
                      dim=2)], dim=1)

    @staticmethod
    def backward(ctx, grad):
        z, = ctx.saved_tensors
        return torch.bmm(z, grad + grad.transpose(1, 2))


def _autocast_off(device_type: str) -> ContextManager:
    """Leave autocast for the block, if it is on (no context otherwise, so
    that an fp32 graph under ``torch.compile`` carries no autocast
    regions)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return nullcontext()


def pays(x: torch.Tensor) -> bool:
    """XCA from the second moments of ``x`` ((B, N, C) tokens) takes less
    time than the straightforward computation: ``N`` is at least
    :data:`MIN_TOKENS_PER_CHANNEL` times ``C`` for its precision (autocast
    on or ``x`` in half precision) and whether gradients are recorded."""
    half = x.dtype in (torch.float16, torch.bfloat16) or \
        torch.is_autocast_enabled(x.device.type)
    least = MIN_TOKENS_PER_CHANNEL[half, torch.is_grad_enabled()]
    return x.shape[-2] >= least * x.shape[-1]


def accumulation_dtype(z: torch.Tensor) -> torch.dtype:
    """fp32 for fp32 and lower precisions (also under autocast), fp64 for
    fp64."""
    return torch.float64 if z.dtype == torch.float64 else torch.float32


def gram(z: torch.Tensor) -> torch.Tensor:
    """The (B, C, C) matrix ``z^T z`` of (B, N, C) tokens, in fp32 (also
    under autocast) or fp64."""
    with _autocast_off(z.device.type):
        return _Gram.apply(z.to(accumulation_dtype(z)))


def xca_matrix(
        gram: torch.Tensor, total: torch.Tensor, n_tokens: int,
        qkv_weight: torch.Tensor, qkv_bias: Optional[torch.Tensor],
        proj_weight: torch.Tensor, proj_bias: Optional[torch.Tensor],
        temperature: torch.Tensor, num_heads: int,
        attn_drop: Callable[[torch.Tensor], torch.Tensor],
        gamma: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Weight (B, C, C) and bias (B, C), in the dtype of ``gram``, such that
    ``gamma * XCA(z) = z weight^T + bias`` per image, from ``gram`` = z^T z
    (B, C, C), ``total`` = the token sums of z (B, C) and ``n_tokens``.
    ``attn_drop`` is applied to the (B, heads, d, d) attention; ``gamma``
    (a layer scale, optional) is folded into the output projection. Runs
    with autocast off: ``gram`` grows with the token count (beyond fp16's
    range at 800x1344) and the attention is a ratio of such products."""
    with _autocast_off(gram.device.type):
        return _xca_matrix(gram, total, n_tokens, qkv_weight, qkv_bias,
                           proj_weight, proj_bias, temperature, num_heads,
                           attn_drop, gamma)


def _xca_matrix(gram, total, n_tokens, qkv_weight, qkv_bias, proj_weight,
                proj_bias, temperature, num_heads, attn_drop, gamma):
    B, C = total.shape
    heads, d = num_heads, C // num_heads
    dtype = gram.dtype
    w = qkv_weight.to(dtype)
    w_qk, w_v = w[:2 * C], w[2 * C:]
    wg = torch.matmul(w_qk, gram)  # (B, 2C, C)
    ws = total @ w_qk.t()  # (B, 2C)
    sq = (wg * w_qk).sum(dim=-1)  # squared L2 norms of the q, k channels
    qk = torch.einsum('bhic,hjc->bhij', wg[:, :C].view(B, heads, d, C),
                      w_qk[C:].view(heads, d, C))
    b_v = None
    if qkv_bias is not None:
        bias = qkv_bias.to(dtype)
        b_qk, b_v = bias[:2 * C], bias[2 * C:]
        sq = sq + b_qk * (2 * ws + n_tokens * b_qk)
        qk = qk + ((ws[:, :C] + n_tokens * b_qk[:C]).view(B, heads, d, 1) *
                   b_qk[C:].view(heads, 1, d) +
                   b_qk[:C].view(heads, d, 1) * ws[:, C:].view(B, heads, 1, d))
    # F.normalize's eps on the L2 norms of the q and k channels
    norm = sq.clamp_min(0).sqrt().clamp_min(1e-12).view(B, 2, heads, d)
    logits = qk / (norm[:, 0].unsqueeze(-1) * norm[:, 1].unsqueeze(-2))
    a = attn_drop((logits * temperature.to(dtype)).softmax(dim=-1))
    proj_w = proj_weight.to(dtype)
    out_bias = (proj_bias.to(dtype) if proj_bias is not None
                else proj_w.new_zeros(C))
    if gamma is not None:
        g = gamma.to(dtype)
        proj_w, out_bias = proj_w * g.unsqueeze(1), out_bias * g
    pa = torch.einsum('ohi,bhij->bohj', proj_w.view(C, heads, d),
                      a).reshape(B, C, C)
    weight = pa @ w_v
    out_bias = out_bias.expand(B, C)
    if b_v is not None:
        out_bias = out_bias + pa @ b_v
    return weight, out_bias
