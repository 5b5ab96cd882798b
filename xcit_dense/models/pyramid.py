"""Resampling the tapped token maps to the pyramid's strides, as in the
published XCiT detection backbone: transposed 2x2 convolutions up (norm and
GELU between two), identity, or max-pooling down.

Two layouts of the levels' sizes (the backbone's ``out_sizes``):

* ``'published'``: what facebookresearch/xcit's ``detection/backbone/xcit.py``
  computes. The stem's stride-2 3x3 convolutions (padding 1) give a token
  grid of ``ceil(H / p)`` rows for patch ``p``; the up-samplers multiply it,
  ``nn.MaxPool2d(k, k)`` rounds down, nothing is cropped: level ``s`` has
  ``ceil(H / p) * p / s`` rows for ``s <= p`` and ``floor(ceil(H / p) * p
  / s)`` above (patch 16, 683 columns: 172, 86, 43, 21).
* ``'ceil'`` (ours): max-pooling in ceil mode and every level cropped to
  exactly ``ceil(H / s)`` rows (:func:`crop`; 171, 86, 43, 22).

Both are the same for every ``H`` and ``W`` that are multiples of 32.
"""
import math
from typing import Iterable, List

import torch
import torch.nn as nn

from . import paths, policy
from .norms import norm_layer
from .ops import onednn
from .ops.folding import fold_batchnorm
from .ops.upsample import upsample2x
from .paths import Decision

TOKEN_GEMMS = 'token GEMMs'


class TransposedConvUpsampler(nn.Sequential):
    """``steps`` stride-2 transposed 2x2 convolutions with a norm and GELU
    between consecutive ones, on NCHW maps (an ``nn.Sequential``, so the
    parameter names are the published checkpoints': ``fpn1.0``, ``fpn1.1``,
    ``fpn1.3``).

    Fast path: each transposed convolution is one token GEMM and a pixel
    shuffle (:mod:`.ops.upsample`), on the map's (B, H*W, C) tokens (a view
    when the map is channels-last, as the backbone's taps are); eval-mode
    BatchNorm is folded into the convolution before it (on every call, from
    the weights as they are), exact GELU fused into its
    GEMM, and the last one writes the NCHW output directly. On the CPU, and
    under ``torch.compile``; on CUDA eagerly it would launch more kernels
    than the transposed convolutions (the policy's CUDA column).
    """
    use_fast_path = True

    @classmethod
    def build(cls, dim: int, steps: int,
              norm_cfg: dict) -> 'TransposedConvUpsampler':
        """``steps`` up-samplings of ``dim`` channels, norms from
        ``norm_cfg``. (The constructor is ``nn.Sequential``'s, so that
        slicing and copying work as for any ``nn.Sequential``.)"""
        layers: List[nn.Module] = []
        for step in range(steps):
            if step:
                layers += [norm_layer(norm_cfg, dim), nn.GELU()]
            layers.append(nn.ConvTranspose2d(dim, dim, kernel_size=2,
                                             stride=2))
        return cls(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if paths.note(self, self._decide(x)):
            return self._token_gemms(x)
        for layer in self:
            x = layer(x)
        return x

    def _decide(self, x: torch.Tensor) -> Decision:
        """Still (transposed 2x2 stride-2 conv, any norm, any activation,
        ...) ending with a transposed conv."""
        decision = policy.decide(self, TransposedConvUpsampler, x,
                                 TOKEN_GEMMS)
        if decision.path is None:
            return decision
        ups = list(self)[0::3]
        if len(self) % 3 != 1 or \
                any(type(up) is not nn.ConvTranspose2d for up in ups):
            return Decision(None, paths.TYPE_REPLACED)
        if not all(policy.is_plain_conv(up)
                   and up.kernel_size == up.stride == (2, 2)
                   and up.padding == up.output_padding == (0, 0)
                   and up.groups == 1 and up.bias is not None
                   for up in ups):
            return Decision(None, paths.LAYER_SETTINGS)
        return decision

    def _token_gemms(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        backend = onednn.select_backend(x, stochastic=False)
        x = x.permute(0, 2, 3, 1).reshape(B, H * W, C)  # tokens
        layers = list(self)
        for i in range(0, len(layers), 3):
            up = layers[i]
            weight, bias = up.weight, up.bias  # (C_in, C_out, 2, 2)
            last = i + 1 == len(layers)
            folded, act = None, None
            if not last:
                folded = fold_batchnorm(weight, bias, layers[i + 1],
                                        transposed=True)
                if folded is not None:
                    weight, bias = folded
                    if policy.is_exact_gelu(layers[i + 2]):
                        act = 'gelu'
            x = upsample2x(x, weight, bias, act, H, W, nchw=last,
                           backend=backend)
            H, W = 2 * H, 2 * W
            if last:
                return x
            # what was not folded or fused runs as modules, on the map
            modules = layers[i + 1:i + 3] if folded is None else \
                [] if act is not None else [layers[i + 2]]
            if modules:
                C = x.shape[-1]
                y = x.view(B, H, W, C).permute(0, 3, 1, 2)
                for module in modules:
                    y = module(y)
                x = y.permute(0, 2, 3, 1).reshape(B, H * W, C)
        raise AssertionError('unreachable: ends with a transposed conv')


def make_resampler(dim: int, scale: float, norm_cfg: dict,
                   out_sizes: str = 'published') -> nn.Module:
    """The module that resamples a token map by ``scale`` (a power of two):
    :class:`TransposedConvUpsampler` up, ``nn.Identity``, or
    ``nn.MaxPool2d`` down: rounding down as the published backbone's
    (``out_sizes='published'``), or in ceil mode, keeping the last row of
    an odd size (``'ceil'``)."""
    if scale == 1:
        return nn.Identity()
    if scale < 1:
        k = round(1 / scale)
        return nn.MaxPool2d(kernel_size=k, stride=k,
                            ceil_mode=out_sizes == 'ceil')
    return TransposedConvUpsampler.build(dim, round(math.log2(scale)),
                                         norm_cfg)


def smallest_grid(resamplers: Iterable[nn.Module]) -> int:
    """Rows (and columns) of the smallest token grid that every one of
    ``resamplers`` maps to at least one row: a max-pooling that rounds down
    needs a grid of its window's size; 1 where none does."""
    sides = [1]
    for module in resamplers:
        if isinstance(module, nn.MaxPool2d) and not module.ceil_mode:
            k, d, pad = (module.kernel_size, module.dilation, module.padding)
            if all(type(v) is int for v in (k, d, pad)):
                sides.append(d * (k - 1) + 1 - 2 * pad)
    return max(sides)


def crop(y: torch.Tensor, H: int, W: int, stride: int) -> torch.Tensor:
    """Pyramid level of an ``H x W`` image at ``stride`` in the ``'ceil'``
    layout: up-sampled maps of a size that is not a multiple of the patch
    cover a little more than the image; keep
    ``ceil(H / stride) x ceil(W / stride)``.

    Written with non-negative operands only: ONNX exporters translate an
    integer floor division into ONNX ``Div``, which truncates, and
    ``-(-H // s)`` would become ``floor(H / s)`` in an exported graph. With
    ``narrow`` rather than a slice, whose end PyTorch 2.11's export cannot
    prove within the map for a free input size (it gave the map an unknown
    size, on which mmdet's FPN could not be exported). A map of that size
    already is returned as it is in eager calls (autograd's backward of a
    crop copies the gradient into zeros, per dimension); traced, compiled
    and exported graphs keep the crop, which holds for every input size."""
    h, w = (H + stride - 1) // stride, (W + stride - 1) // stride
    if type(h) is int and type(w) is int and \
            tuple(y.shape[-2:]) == (h, w) and \
            not (torch.jit.is_tracing() or torch.compiler.is_compiling()):
        return y
    return y.narrow(-2, 0, h).narrow(-1, 0, w)
