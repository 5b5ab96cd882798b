"""The convolutional patch embedding (stem), with its folded fast path."""
from typing import Optional, Tuple, Type

import torch
import torch.nn as nn
from timm.models.xcit import ConvPatchEmbed as TimmConvPatchEmbed

from . import paths, policy
from .norms import norm_layer
from .ops import onednn
from .ops.folding import fold_batchnorm
from .paths import Decision

CHANNELS_LAST = 'channels last'


class ConvPatchEmbed(TimmConvPatchEmbed):
    """Stride-2 3x3 convolutions, each followed by a norm, with an activation
    between them (3 for patch 8, 4 for patch 16): timm's module with the
    norms built from ``norm_cfg`` (BatchNorm by default).

    Returns (B, N, C) tokens and the token grid ``(Hp, Wp)``. Fast path: the
    convolutions write channels-last maps (the tokens are then a view, no
    copy); off CUDA's eager path eval-mode BatchNorm is folded into the
    convolution before it (on every call, from the weights as they are) and
    exact GELU fused into it (oneDNN, fp32 CPU inference). On CUDA's eager
    path, bound by kernel launches, a fold launches more kernels than the
    BatchNorm pass it saves: the norms run as modules there.
    """
    use_fast_path = True

    def __init__(self, patch_size: int = 16, in_chans: int = 3,
                 embed_dim: int = 768, act_layer: Type[nn.Module] = nn.GELU,
                 norm_cfg: Optional[dict] = None):
        super().__init__(patch_size=patch_size, in_chans=in_chans,
                         embed_dim=embed_dim, act_layer=act_layer)
        if norm_cfg is not None:
            for conv_norm in self.proj[0::2]:  # (conv, norm) pairs
                conv_norm[1] = norm_layer(norm_cfg,
                                          conv_norm[0].out_channels)

    def forward(self, x: torch.Tensor
                ) -> Tuple[torch.Tensor, Tuple[int, int]]:
        if self._fast_path(x):
            return self._channels_last(x)
        x = self.proj(x)
        Hp, Wp = x.shape[2], x.shape[3]
        return x.flatten(2).transpose(1, 2), (Hp, Wp)

    def _fast_path(self, x: torch.Tensor) -> Optional[str]:
        """The fast path that runs for ``x``, or None (the straightforward
        computation): :meth:`_decide`'s, noted for :mod:`.paths`."""
        return paths.note(self, self._decide(x))

    def _decide(self, x: torch.Tensor) -> Decision:
        """``proj`` still the (conv, norm) pairs with one module between
        consecutive pairs, each conv an ``nn.Conv2d`` the kernels
        compute."""
        decision = policy.decide(self, ConvPatchEmbed, x, CHANNELS_LAST)
        if decision.path is None:
            return decision
        proj = self.proj
        if type(proj) is not nn.Sequential or len(proj) % 2 != 1:
            return Decision(None, paths.TYPE_REPLACED)
        for pair in list(proj)[0::2]:
            if type(pair) is not nn.Sequential or len(pair) != 2 or \
                    type(pair[0]) is not nn.Conv2d:
                return Decision(None, paths.TYPE_REPLACED)
            reason = policy.conv_refusal(pair[0])
            if reason is not None:
                return Decision(None, reason)
        return decision

    def _channels_last(self, x: torch.Tensor
                       ) -> Tuple[torch.Tensor, Tuple[int, int]]:
        backend = onednn.select_backend(x, stochastic=False)
        fold = not policy.on_kernel_device(x)
        x = x.contiguous(memory_format=torch.channels_last)
        layers = list(self.proj)
        for i in range(0, len(layers), 2):
            conv, norm = layers[i]
            act_layer = layers[i + 1] if i + 1 < len(layers) else None
            act = 'gelu' if act_layer is not None and \
                policy.is_exact_gelu(act_layer) else None
            folded = fold_batchnorm(conv.weight, conv.bias, norm) \
                if fold else None
            if folded is None:  # CUDA, batch statistics, or another norm
                x = norm(conv(x))
                act = None
            else:
                x = onednn.conv2d(x, *folded, conv.stride, conv.padding,
                                  conv.groups, act=act, backend=backend)
            if act_layer is not None and act is None:
                x = act_layer(x)
        B, C, H, W = x.shape
        # channels-last NCHW is (B, H, W, C) in memory: a view, no copy
        return x.permute(0, 2, 3, 1).reshape(B, H * W, C), (H, W)
