"""Cross-covariance attention (XCA), with its fast paths: the second moments
(CPU, and CUDA under ``torch.compile``) and the attention core's Triton
kernels (CUDA, eager)."""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models.xcit import XCA as TimmXCA

from . import paths, policy
from .ops import (
    casts,
    layer_norm_kernels,
    onednn,
    pieces,
    second_moments,
    xca_kernels,
)
from .ops.residual import scaled_residual
from .paths import Decision

SECOND_MOMENTS, KERNELS = 'second moments', 'kernels'


class XCA(TimmXCA):
    """Attention across channels: per head, ``softmax(q^T k * t)`` over the
    L2-normalised channels of the query and key (a d x d map, so the cost is
    linear in the tokens), applied to the value channels and projected.

    timm's module (parameters ``qkv``, ``proj``, ``temperature``) with two
    fast paths in :meth:`forward` beside the straightforward computation:

    * on the CPU, and on CUDA under ``torch.compile``: the attention from the
      second moments of the input, folded with the value and output
      projections into one C x C matrix per image
      (:mod:`.ops.second_moments`), on oneDNN GEMMs for fp32 CPU, by pieces
      of tokens in inference; for inputs of enough tokens per channel
      (:func:`.ops.second_moments.pays`: its C x C products cost more than
      the token GEMMs they replace below that, the demos' 128x128 images
      among them; ``'always'`` takes it for any).
      :meth:`residual_forward` is the block's entry: the pre-norm, layer
      scale and residual folded into the same two passes.
    * on CUDA, eagerly: the ``qkv`` and ``proj`` layers as they are, and
      between them the normalisation, attention and its product with the
      values in three Triton kernels each way (:mod:`.ops.xca_kernels`), for
      fp32, fp16 and bf16 with inactive attention dropout;
      :meth:`residual_forward` adds the layer-scaled branch to the residual
      in one pass; under autocast the ``qkv`` and ``proj`` weights are cast
      once in inference, not on every call, and together in training
      (plain ``nn.Linear`` layers without hooks; any other runs as it is).
    """
    use_fast_path = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) tokens -> (B, N, C)."""
        return self._forward(x, self._fast_path(x))

    def _forward(self, x: torch.Tensor, path: Optional[str]) -> torch.Tensor:
        """:meth:`forward` on ``path``, the fast path :meth:`_fast_path`
        chose (None: the straightforward computation)."""
        if path == SECOND_MOMENTS:
            return self._from_second_moments(x)
        B, N, C = x.shape
        heads = self.num_heads
        weights = self._autocast_weights(x, path)
        qkv = self._linear(self.qkv, x, weights and weights[0])
        if path == KERNELS and self._kernels_take(qkv):
            x = xca_kernels.attention(qkv, self.temperature, heads)
        else:
            # (3, B, heads, d, N): channels of each head as rows
            qkv = qkv.reshape(B, N, 3, heads, C // heads)
            q, k, v = qkv.permute(2, 0, 3, 4, 1).unbind(0)
            q = F.normalize(q, dim=-1)
            k = F.normalize(k, dim=-1)
            attn = (q @ k.transpose(-2, -1)) * self.temperature
            attn = self.attn_drop(attn.softmax(dim=-1))
            x = (attn @ v).permute(0, 3, 1, 2).reshape(B, N, C)
        return self.proj_drop(
            self._linear(self.proj, x, weights and weights[1]))

    def _autocast_weights(self, x: torch.Tensor, path: Optional[str]
                          ) -> Optional[list]:
        """On the kernels' path under autocast, with plain ``nn.Linear``
        layers without hooks: ``qkv``'s and ``proj``'s weights and biases
        in autocast's dtype, cast together on every call
        (:func:`.ops.casts.autocast_weights`). Else None: the
        layers run as they are."""
        dtype = policy.kernel_dtype(x)
        if path != KERNELS or not (policy.is_plain_linear(self.qkv) and
                                   policy.is_plain_linear(self.proj)) or \
                dtype == self.qkv.weight.dtype:
            return None
        return casts.autocast_weights((self.qkv, self.proj), dtype)

    @staticmethod
    def _linear(layer: nn.Module, x: torch.Tensor,
                weights: Optional[tuple]) -> torch.Tensor:
        """``layer(x)``, or with ``weights`` (its own, cast) as its call."""
        return layer(x) if weights is None else F.linear(x, *weights)

    def residual_forward(self, x: torch.Tensor, norm: nn.Module,
                         gamma: torch.Tensor,
                         drop_path: nn.Module) -> torch.Tensor:
        """``x + drop_path(gamma * self(norm(x)))``: the attention branch of
        a block."""
        path = self._fast_path(x)
        if path == SECOND_MOMENTS and type(norm) is nn.LayerNorm:
            # the stream in the dtype the straightforward addition gives it
            # (fp32 from a half-precision one and an fp32 layer scale)
            x = x.to(torch.promote_types(x.dtype, gamma.dtype))
            return self._from_second_moments(x, norm, gamma, drop_path)
        if path == KERNELS:
            # the norm's output, in the dtype the qkv layer takes, on the
            # path decided for x (nothing the decision reads differs)
            z = self._forward(layer_norm_kernels.pre_norm(norm, x), path)
            if policy.is_inactive(drop_path):
                # the layer scale and the residual in one pass
                return scaled_residual(x, gamma, z)
            return x + drop_path(gamma * z)
        return x + drop_path(gamma * self(norm(x)))

    def _fast_path(self, x: torch.Tensor) -> Optional[str]:
        """The fast path that runs for ``x``, or None (the straightforward
        computation): :meth:`_decide`'s, noted for :mod:`.paths`."""
        return paths.note(self, self._decide(x))

    def _decide(self, x: torch.Tensor) -> Decision:
        """On a device of the Triton kernels, the kernels (their dtype,
        the ``qkv`` layer's output's, is checked once it is there:
        :meth:`_kernels_take`); elsewhere the second moments, for enough
        tokens (any number under ``'always'``)."""
        on_kernel_device = policy.on_kernel_device(x)
        decision = policy.decide(
            self, XCA, x, KERNELS if on_kernel_device else SECOND_MOMENTS)
        if decision.path is None:
            return decision
        if on_kernel_device:
            if not xca_kernels.available():
                return Decision(None, paths.KERNEL_UNAVAILABLE)
            if not policy.is_inactive(self.attn_drop):
                return Decision(None, paths.DROPOUT_LIVE)
            return decision
        if type(self.qkv) is not nn.Linear or \
                type(self.proj) is not nn.Linear:
            return Decision(None, paths.TYPE_REPLACED)
        if decision.reason != paths.FORCED and not second_moments.pays(x):
            return Decision(None, paths.TOO_FEW_TOKENS)
        return decision

    def _kernels_take(self, qkv: torch.Tensor) -> bool:
        """The kernels compute the attention of ``qkv`` as the ``qkv`` layer
        gave it: its dtype is one they are written for, and they compile
        and run for it and this head width (:func:`.xca_kernels.works`).
        If not, the straightforward computation's attention runs, noted for
        :mod:`.paths`."""
        if qkv.dtype not in policy.KERNEL_DTYPES:
            reason = paths.DTYPE
        elif not xca_kernels.works(qkv.device, qkv.dtype,
                                   qkv.shape[-1] // (3 * self.num_heads)):
            reason = paths.KERNEL_UNAVAILABLE
        else:
            return True
        paths.note(self, Decision(None, reason))
        return False

    def _from_second_moments(self, x: torch.Tensor,
                             norm: Optional[nn.Module] = None,
                             gamma: Optional[torch.Tensor] = None,
                             drop_path: Optional[nn.Module] = None
                             ) -> torch.Tensor:
        """XCA of ``norm(x)`` in two passes over the tokens: accumulate
        ``z^T z`` and the token sums of ``z = norm(x)``, then apply one
        (C x C) matrix per image. With ``norm`` given, returns the residual
        branch ``x + drop_path(gamma * XCA(norm(x)))``."""
        B, N, C = x.shape
        residual = norm is not None
        live = not policy.is_inactive(self.proj_drop) or (
            residual and not policy.is_inactive(drop_path))
        backend = onednn.select_backend(x, stochastic=live)
        ranges = pieces.pieces(N, C, x)  # C-wide temporaries

        def normed(sl: slice) -> torch.Tensor:
            return norm(x[:, sl]) if residual else x[:, sl]

        whole = normed(ranges[0]) if len(ranges) == 1 else None
        gram, total = 0, 0
        for sl in ranges:
            z = whole if whole is not None else normed(sl)
            gram = gram + second_moments.gram(z)
            total = total + z.sum(
                dim=1, dtype=second_moments.accumulation_dtype(z))
        weight, bias = second_moments.xca_matrix(
            gram, total, N, self.qkv.weight, self.qkv.bias, self.proj.weight,
            self.proj.bias, self.temperature, self.num_heads, self.attn_drop,
            gamma)
        weight, bias = weight.to(x.dtype), bias.to(x.dtype)
        # the residual inside the GEMM when dropout and drop-path are
        # identities (the 'fused' backend)
        fuse_residual = residual and backend == 'fused'

        def output(sl: slice) -> torch.Tensor:
            z = whole if whole is not None else normed(sl)
            xs = x[:, sl]
            if backend == 'torch':
                y = torch.baddbmm(bias.unsqueeze(1), z, weight.transpose(1, 2))
            else:  # one GEMM per image: each has its own matrix
                res = xs if fuse_residual else [None] * B
                outs = [onednn.linear(z[i], weight[i], bias[i],
                                      residual=res[i], backend=backend)
                        for i in range(B)]
                y = torch.stack(outs) if B > 1 else outs[0].unsqueeze(0)
                if fuse_residual:
                    return y
            y = self.proj_drop(y)
            return xs + drop_path(y) if residual else y

        return pieces.assemble(x, ranges, C, output)
