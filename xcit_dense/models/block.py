"""The XCiT block: XCA, local patch interaction and MLP, each a residual
branch with its own pre-norm and layer scale."""
from functools import partial
from typing import Callable, Optional, Type

import torch
import torch.nn as nn
from timm.layers import DropPath
from torch.utils.checkpoint import checkpoint

from . import paths, policy
from .lpi import LPI
from .mlp import Mlp
from .paths import Decision
from .xca import XCA

FOLDED = 'folded branches'


class XCABlock(nn.Module):
    """``x + gamma1 * XCA(norm1(x))``, then ``+ gamma3 * LPI(norm3(x))``, then
    ``+ gamma2 * MLP(norm2(x))`` (the published branch order; names and
    parameters as timm's ``XCABlock``).

    Fast path: when the three branches are exactly :class:`XCA`,
    :class:`LPI` and :class:`Mlp`, each branch's ``residual_forward`` folds
    the pre-norm, the layer scale and the residual addition into its own
    kernels; any other branch module (a subclass, a wrapper, a replacement)
    is called through its ``forward`` as written below. ``with_cp``
    checkpoints the block (mmdet's convention: inside the block).
    """
    use_fast_path = True

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.,
                 qkv_bias: bool = False, proj_drop: float = 0.,
                 attn_drop: float = 0., drop_path: float = 0.,
                 act_layer: Type[nn.Module] = nn.GELU,
                 norm_layer: Callable[[int], nn.Module] = partial(
                     nn.LayerNorm, eps=1e-6),
                 eta: float = 1., norm_cfg: Optional[dict] = None,
                 with_cp: bool = False):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = XCA(dim, num_heads=num_heads, qkv_bias=qkv_bias,
                        attn_drop=attn_drop, proj_drop=proj_drop)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 \
            else nn.Identity()
        self.norm3 = norm_layer(dim)
        self.local_mp = LPI(dim, act_layer=act_layer, norm_cfg=norm_cfg)
        self.drop_path3 = DropPath(drop_path) if drop_path > 0 \
            else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, hidden_features=int(dim * mlp_ratio),
                       act_layer=act_layer, drop=proj_drop)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 \
            else nn.Identity()
        self.gamma1 = nn.Parameter(eta * torch.ones(dim))
        self.gamma3 = nn.Parameter(eta * torch.ones(dim))
        self.gamma2 = nn.Parameter(eta * torch.ones(dim))
        self.with_cp = with_cp

    def forward(self, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
        """(B, N, C) tokens of an H x W grid -> (B, N, C)."""
        if self.with_cp and torch.is_grad_enabled():
            return checkpoint(self._forward, x, H, W, use_reentrant=False)
        return self._forward(x, H, W)

    def _forward(self, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
        if self._fast_path(x):
            x = self.attn.residual_forward(x, self.norm1, self.gamma1,
                                           self.drop_path1)
            x = self.local_mp.residual_forward(x, H, W, self.norm3,
                                               self.gamma3, self.drop_path3)
            return self.mlp.residual_forward(x, self.norm2, self.gamma2,
                                             self.drop_path2)
        x = x + self.drop_path1(self.gamma1 * self.attn(self.norm1(x)))
        x = x + self.drop_path3(self.gamma3 * self.local_mp(self.norm3(x),
                                                            H, W))
        return x + self.drop_path2(self.gamma2 * self.mlp(self.norm2(x)))

    def _fast_path(self, x: torch.Tensor) -> Optional[str]:
        """The fast path that runs for ``x``, or None (the straightforward
        computation): :meth:`_decide`'s, noted for :mod:`.paths`."""
        return paths.note(self, self._decide(x))

    def _decide(self, x: torch.Tensor) -> Decision:
        """Exactly its three branch classes, and each layer scale a (C,)
        tensor, one value per channel (what the branches fold into their
        weights and kernels; a scalar or broadcast one, ReZero's say, runs
        as written)."""
        decision = policy.decide(self, XCABlock, x, FOLDED)
        if decision.path is None:
            return decision
        if type(self.attn) is not XCA or type(self.local_mp) is not LPI or \
                type(self.mlp) is not Mlp:
            return Decision(None, paths.TYPE_REPLACED)
        channels = (x.shape[-1], )
        if not all(isinstance(g, torch.Tensor) and g.shape == channels
                   for g in (self.gamma1, self.gamma3, self.gamma2)):
            return Decision(None, paths.LAYER_SETTINGS)
        return decision
