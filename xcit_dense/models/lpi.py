"""Local patch interaction (LPI), with its fast paths: channels-last
convolutions (CPU, and CUDA under ``torch.compile``) and Triton kernels
(CUDA, eager)."""
from typing import Optional, Type

import torch
import torch.nn as nn
from timm.models.xcit import LPI as TimmLPI

from . import paths, policy
from .norms import norm_layer
from .ops import layer_norm_kernels, lpi_kernels, onednn
from .ops.folding import fold_scale
from .paths import Decision

CHANNELS_LAST, KERNELS = 'channels last', 'kernels'


class LPI(TimmLPI):
    """Two depth-wise 3x3 convolutions with an activation and a norm between
    them, mixing each token with its neighbours on the token grid.

    timm's module (``conv1``, ``act``, ``bn``, ``conv2``) with the norm built
    from ``norm_cfg`` (BatchNorm by default), and two fast paths in
    :meth:`forward` and :meth:`residual_forward` beside the straightforward
    computation:

    * on the CPU, and on CUDA under ``torch.compile``: the convolutions run
      on a channels-last *view* of the (B, N, C) tokens (no NCHW copies),
      with the activation fused into the first on oneDNN (for enough
      tokens: :func:`.ops.onednn.pays`); in :meth:`residual_forward`
      the layer scale is folded into the second and, in inference, the
      residual added inside it.
    * on CUDA, eagerly: the whole branch, layer scale and residual included,
      in Triton kernels (three forward, five backward) on the tokens as
      they lie (:mod:`.ops.lpi_kernels`), for depth-wise 3x3
      convolutions, exact GELU and ``nn.BatchNorm2d`` or
      ``nn.SyncBatchNorm`` (batch statistics, synchronised across
      processes for SyncBN, and running averages as the norm's own forward
      keeps them) in fp32, fp16 and bf16; also mmengine's BatchNorm that
      its runner puts in place of SyncBN in one process
      (:data:`~xcit_dense.models.policy.BATCH_NORMS`).
    """
    use_fast_path = True

    def __init__(self, in_features: int, act_layer: Type[nn.Module] = nn.GELU,
                 norm_cfg: Optional[dict] = None):
        super().__init__(in_features, act_layer=act_layer)
        if norm_cfg is not None:
            self.bn = norm_layer(norm_cfg, in_features)

    def forward(self, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
        """(B, N, C) tokens of an H x W grid -> (B, N, C)."""
        path = self._fast_path(x)
        if path == KERNELS:
            return self._kernels(x, H, W)
        if path == CHANNELS_LAST:
            return self._channels_last(x, H, W)
        B, N, C = x.shape
        x = x.permute(0, 2, 1).reshape(B, C, H, W)
        x = self.conv2(self.bn(self.act(self.conv1(x))))
        return x.reshape(B, -1, N).permute(0, 2, 1)

    def residual_forward(self, x: torch.Tensor, H: int, W: int,
                         norm: nn.Module, gamma: torch.Tensor,
                         drop_path: nn.Module) -> torch.Tensor:
        """``x + drop_path(gamma * self(norm(x), H, W))``: the local branch
        of a block."""
        path = self._fast_path(x)
        if path == KERNELS:
            # the norm's output in the dtype the kernels take
            z = layer_norm_kernels.pre_norm(norm, x)
            if policy.is_inactive(drop_path):
                return self._kernels(z, H, W, gamma, x)
            return x + drop_path(self._kernels(z, H, W, gamma))
        if path == CHANNELS_LAST:
            return self._channels_last(norm(x), H, W, gamma, x, drop_path)
        return x + drop_path(gamma * self(norm(x), H, W))

    def _fast_path(self, x: torch.Tensor) -> Optional[str]:
        """The fast path that runs for ``x``, or None (the straightforward
        computation): :meth:`_decide`'s, noted for :mod:`.paths`."""
        return paths.note(self, self._decide(x))

    def _decide(self, x: torch.Tensor) -> Decision:
        """On a device of the Triton kernels, the kernels where they
        compute this module (:meth:`_kernels_refusal`); elsewhere the
        channels-last convolutions."""
        on_kernel_device = policy.on_kernel_device(x)
        decision = policy.decide(
            self, LPI, x, KERNELS if on_kernel_device else CHANNELS_LAST)
        if decision.path is None:
            return decision
        reason = policy.conv_refusal(self.conv1) or \
            policy.conv_refusal(self.conv2)
        if reason is None and on_kernel_device:
            reason = self._kernels_refusal(x)
        return decision if reason is None else Decision(None, reason)

    def _kernels_refusal(self, x: torch.Tensor) -> Optional[str]:
        """Why the Triton kernels do not compute this module on ``x``, or
        None where they do: depth-wise 3x3 convolutions of stride 1 and
        padding 1 on its channels, exact GELU, one of
        :data:`~xcit_dense.models.policy.BATCH_NORMS` (with more than one
        value per channel to normalise in training, else its own error is
        raised), a dtype the kernels are written for, and kernels that
        compile and run for it (:func:`.lpi_kernels.works`, asked last)."""
        B, N, C = x.shape
        bn, convs = self.bn, (self.conv1, self.conv2)
        dtype = policy.kernel_dtype(x)
        if not lpi_kernels.available():
            return paths.KERNEL_UNAVAILABLE
        if dtype not in policy.KERNEL_DTYPES:
            return paths.DTYPE
        if any(type(c) is not nn.Conv2d for c in convs) or \
                type(self.act) is not nn.GELU or \
                type(bn) not in policy.BATCH_NORMS:
            return paths.TYPE_REPLACED
        if not all(c.groups == C == c.in_channels == c.out_channels and
                   c.kernel_size == (3, 3) and c.stride == (1, 1) and
                   c.padding == (1, 1) for c in convs) or \
                not policy.is_exact_gelu(self.act) or bn.num_features != C:
            return paths.LAYER_SETTINGS
        if (bn.training or bn.running_mean is None) and B * N == 1:
            return paths.TOO_FEW_TOKENS
        if not lpi_kernels.works(x.device, dtype, bn, x.dtype):
            return paths.KERNEL_UNAVAILABLE
        return None

    def _kernels(self, y: torch.Tensor, H: int, W: int,
                 gamma: Optional[torch.Tensor] = None,
                 residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        """LPI of (B, N, C) tokens ``y`` in Triton kernels; with ``gamma``
        times it, with ``residual`` plus it. Under autocast the tokens go
        in autocast's dtype, as the straightforward convolutions take
        them."""
        y = y.to(policy.kernel_dtype(y))
        return lpi_kernels.local_interaction(y, H, W, self.conv1, self.bn,
                                             self.conv2, gamma, residual)

    def _channels_last(self, y: torch.Tensor, H: int, W: int,
                       gamma: Optional[torch.Tensor] = None,
                       residual: Optional[torch.Tensor] = None,
                       drop_path: Optional[nn.Module] = None) -> torch.Tensor:
        """LPI of (B, N, C) tokens ``y`` on their channels-last view; with
        ``residual``, ``residual + drop_path(gamma * LPI(y))``."""
        B, N, C = y.shape
        live = residual is not None and not policy.is_inactive(drop_path)
        backend = onednn.select_backend(
            y, stochastic=live, by_size=not policy.forced(self))
        y = y.reshape(B, H, W, C).permute(0, 3, 1, 2)  # NCHW, channels-last
        conv1, conv2 = self.conv1, self.conv2
        act = 'gelu' if policy.is_exact_gelu(self.act) else None
        y = onednn.conv2d(y, conv1.weight, conv1.bias,
                          conv1.stride, conv1.padding, conv1.groups, act=act,
                          backend=backend)
        if act is None:
            y = self.act(y)
        y = self.bn(y)
        weight, bias = fold_scale(conv2.weight, conv2.bias, gamma)
        args = (conv2.stride, conv2.padding, conv2.groups)
        if residual is not None and backend == 'fused':
            x_map = residual.reshape(B, H, W, C).permute(0, 3, 1, 2)
            y = onednn.conv2d(y, weight, bias, *args, residual=x_map,
                              backend=backend)
            return y.permute(0, 2, 3, 1).reshape(B, N, C)
        y = onednn.conv2d(y, weight, bias, *args, backend=backend)
        y = y.permute(0, 2, 3, 1).reshape(B, N, -1)
        return y if residual is None else residual + drop_path(y)
