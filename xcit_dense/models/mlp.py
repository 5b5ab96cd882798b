"""The block's MLP, with its fused fast path."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from timm.layers import Mlp as TimmMlp

from . import paths, policy
from .ops import casts, layer_norm_kernels, onednn, pieces
from .ops.folding import fold_scale
from .ops.residual import scaled_residual
from .paths import Decision

FUSED = 'fused'


class Mlp(TimmMlp):
    """``fc1``, activation, dropout, (norm), ``fc2``, dropout: timm's module
    with a fast path in :meth:`forward` beside the straightforward
    computation. For fp32 on CPU the linear layers run on oneDNN (for
    enough tokens: :func:`.ops.onednn.pays`), with exact GELU fused
    into ``fc1``; in training the whole MLP is one autograd
    function that keeps only the pre-activation (:func:`.ops.onednn.mlp`);
    in inference it runs by pieces of tokens (the hidden layer is 4x as
    wide). :meth:`residual_forward` folds the block's pre-norm, layer scale
    and, in inference, the residual into the same pass. Elsewhere (CUDA,
    autocast, ``torch.compile``) the linear layers are PyTorch's, with the
    layer scale folded into ``fc2``; on CUDA's eager path it is applied
    with the residual in one pass instead, and under autocast the weights
    are cast together (fewer launches).
    """
    use_fast_path = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fast_path(x):
            return self._fused(x)
        x = self.drop1(self.act(self.fc1(x)))
        return self.drop2(self.fc2(self.norm(x)))

    def residual_forward(self, x: torch.Tensor, norm: nn.Module,
                         gamma: torch.Tensor,
                         drop_path: nn.Module) -> torch.Tensor:
        """``x + drop_path(gamma * self(norm(x)))``: the MLP branch of a
        block."""
        if self._fast_path(x) and type(norm) is nn.LayerNorm:
            return self._fused(x, norm, gamma, drop_path)
        return x + drop_path(gamma * self(norm(x)))

    def _fast_path(self, x: torch.Tensor) -> Optional[str]:
        """The fast path that runs for ``x``, or None (the straightforward
        computation): :meth:`_decide`'s, noted for :mod:`.paths`."""
        return paths.note(self, self._decide(x))

    def _decide(self, x: torch.Tensor) -> Decision:
        """The fused kernels, for plain ``nn.Linear`` layers."""
        decision = policy.decide(self, Mlp, x, FUSED)
        if decision.path is not None and (type(self.fc1) is not nn.Linear or
                                          type(self.fc2) is not nn.Linear):
            return Decision(None, paths.TYPE_REPLACED)
        return decision

    def _fused(self, x: torch.Tensor, norm: Optional[nn.Module] = None,
               gamma: Optional[torch.Tensor] = None,
               drop_path: Optional[nn.Module] = None) -> torch.Tensor:
        """The MLP of ``x`` (or, with ``norm``, the residual branch
        ``x + drop_path(gamma * MLP(norm(x)))``) on fused kernels."""
        B, N, _ = x.shape
        residual = norm is not None
        fc1, fc2 = self.fc1, self.fc2
        act = 'gelu' if policy.is_exact_gelu(self.act) else None
        dropout_off = policy.is_inactive(self.drop1) and \
            policy.is_inactive(self.drop2)
        live = not dropout_off or (
            residual and not policy.is_inactive(drop_path))
        backend = onednn.select_backend(
            x, stochastic=live, by_size=not policy.forced(self))
        # CUDA's eager path: PyTorch's GEMMs on a device of the kernels
        cudas = backend == 'torch' and policy.on_kernel_device(x)
        # there the layer scale with the residual in one pass after fc2
        # (folding it into fc2 launches two products, their two backward
        # products and a sum more per call, and in inference two casts of
        # the weights); else folded into fc2 (in training autograd then
        # keeps no product for gamma's gradient)
        scale_after = residual and not live and cudas
        w1, b1, w2, b2 = self._fused_weights(x, gamma, scale_after)
        # fc1, GELU, fc2 as one kernel call (one autograd function)
        one_call = act is not None and dropout_off and \
            type(self.norm) is nn.Identity and \
            fc1.bias is not None and fc2.bias is not None
        # the residual inside the last GEMM when dropout and drop-path are
        # identities (the 'fused' backend)
        fuse_residual = residual and backend == 'fused'

        def output(sl: slice) -> torch.Tensor:
            xs = x[:, sl]
            if not residual:
                z = xs
            elif cudas:  # the norm's output in the dtype fc1 takes
                z = layer_norm_kernels.pre_norm(norm, xs)
            else:
                z = norm(xs)
            res = xs if fuse_residual else None
            if one_call:  # dropout is off: drop1, drop2 are identities
                y = onednn.mlp(z, w1, b1, w2, b2, residual=res,
                               backend=backend)
            else:
                y = onednn.linear(z, w1, b1, act=act, backend=backend)
                if act is None:
                    y = self.act(y)
                y = self.norm(self.drop1(y))
                y = onednn.linear(y, w2, b2, residual=res, backend=backend)
                if not fuse_residual:
                    y = self.drop2(y)
            if fuse_residual or not residual:
                return y
            if scale_after:
                return scaled_residual(xs, gamma, y)
            return xs + drop_path(y)

        return pieces.assemble(x, pieces.pieces(N, fc1.out_features, x),
                               fc2.out_features, output)

    def _fused_weights(self, x: torch.Tensor, gamma: Optional[torch.Tensor],
                       scale_after: bool) -> Tuple[torch.Tensor, ...]:
        """fc1's and fc2's weights and biases for the fused kernels: cast
        together under autocast where the layer scale comes after fc2, else
        with ``gamma`` folded into fc2's."""
        fc1, fc2 = self.fc1, self.fc2
        if scale_after:
            dtype = policy.kernel_dtype(x)
            (w1, b1), (w2, b2) = casts.autocast_weights((fc1, fc2), dtype)
            return w1, b1, w2, b2
        return (fc1.weight, fc1.bias) + fold_scale(fc2.weight, fc2.bias,
                                                   gamma)
