"""XCiT backbone for dense prediction.

Cross-Covariance Image Transformers (El-Nouby et al., 2021,
https://arxiv.org/abs/2106.09681) built on timm's ``Xcit``: its convolutional
stem, Fourier positional encoding, XCA blocks and ``forward_intermediates`` are
used as they are; this module adds what dense prediction needs on top:

* presets for every published size (dims, heads and layer-scale eta as timm's
  ``xcit_*`` entry points),
* a 4-level pyramid (strides 4, 8, 16, 32) resampled from chosen blocks in the
  published way (transposed convolutions up, max-pooling down), for any input
  size: level ``i`` of an ``H x W`` image is exactly
  ``ceil(H / s_i) x ceil(W / s_i)``,
* a positional encoding cached per token grid, configurable normalisation
  (BatchNorm by default, SyncBN only by configuration), frozen stages,
  ``norm_eval``, gradient checkpointing, and strict loading of ImageNet
  checkpoints through ``init_cfg``.

The module imports neither mmdet nor mmsegmentation; both build it through the
``xcit_dense`` registry scope (``dict(type='xcit_dense.XCiT', ...)``).
"""
import math
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from mmengine.logging import MMLogger
from mmengine.model import BaseModule
from timm.models.xcit import PositionalEncodingFourier, Xcit
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

from ..registry import MODELS
from . import kernels

# name: (embed_dim, depth, num_heads, eta), as in timm's ``xcit_<name>_p*``
# entry points and the XCiT paper (Table 1).
_SIZES: Dict[str, Tuple[int, int, int, float]] = {
    'nano_12': (128, 12, 4, 1.0),
    'tiny_12': (192, 12, 4, 1.0),
    'small_12': (384, 12, 8, 1.0),
    'tiny_24': (192, 24, 4, 1e-5),
    'small_24': (384, 24, 8, 1e-5),
    'medium_24': (512, 24, 8, 1e-5),
    'large_24': (768, 24, 16, 1e-5),
}
PATCH_SIZES = (8, 16)
ARCH_SETTINGS: Dict[str, dict] = {
    f'{name}_p{patch}': dict(
        patch_size=patch, embed_dim=dim, depth=depth, num_heads=heads,
        eta=eta)
    for name, (dim, depth, heads, eta) in _SIZES.items()
    for patch in (16, 8)
}
DEFAULT_ARCH = 'small_12_p16'
AUTOCAST_DTYPES = (None, 'bfloat16', 'float16')
# Blocks tapped for the four pyramid levels (published detection configs).
DEFAULT_OUT_INDICES = {12: (3, 5, 7, 11), 24: (7, 11, 15, 23)}


def _is_exact_gelu(module: Optional[nn.Module]) -> bool:
    return isinstance(module, nn.GELU) and module.approximate == 'none'


def _fold_batchnorm(
        weight: torch.Tensor, bias: Optional[torch.Tensor], norm: nn.Module
) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """Weight and bias of ``norm(conv(x))`` as one convolution, for a
    BatchNorm that uses running statistics (eval mode); ``None`` otherwise.
    ``weight`` has output channels first."""
    if not isinstance(norm, _BatchNorm) or norm.training or \
            norm.running_var is None:
        return None
    scale = torch.rsqrt(norm.running_var + norm.eps)
    if norm.weight is not None:
        scale = scale * norm.weight
    shift = -norm.running_mean * scale
    if norm.bias is not None:
        shift = shift + norm.bias
    if bias is not None:
        shift = shift + bias * scale
    return weight * scale.view(-1, *([1] * (weight.dim() - 1))), shift


def _crop(y: torch.Tensor, H: int, W: int, stride: int) -> torch.Tensor:
    """Pyramid level of an ``H x W`` image at ``stride``: up-sampled maps
    of a size that is not a multiple of the patch cover a little more than
    the image; keep ``ceil(H / stride) x ceil(W / stride)``."""
    return y[..., :-(-H // stride), :-(-W // stride)]


def _tokens_to_nchw(x: torch.Tensor, H: int, W: int) -> torch.Tensor:
    B, _, C = x.shape
    out = x.new_empty(B, C, H, W)
    out.view(B, C, H * W).copy_(x.transpose(1, 2))
    return out


class CachedFourierEncoding(PositionalEncodingFourier):
    """timm's Fourier positional encoding, with its features cached per grid.

    The sine/cosine features depend only on the token grid, so they are
    computed once per grid size, device and dtype and kept (the most recently
    used ``cache_size`` entries); the learned 1x1 projection runs on every call so
    gradients and weight updates are honoured. The output is identical to
    timm's, broadcast over the batch instead of copied.
    """

    def __init__(self, *args, cache_size: int = 32, **kwargs):
        super().__init__(*args, **kwargs)
        self.cache_size = cache_size
        self._features: 'OrderedDict[tuple, torch.Tensor]' = OrderedDict()

    def fourier_features(self, H: int, W: int, device: torch.device,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Un-projected encoding of an ``H x W`` grid, ``(1, 2*hidden, H, W)``,
        computed in float32 as timm does and cast to ``dtype``."""
        key = (H, W, device, dtype)
        feats = self._features.get(key)
        if feats is not None:
            self._features.move_to_end(key)
            return feats
        y = torch.arange(1, H + 1, device=device, dtype=torch.float32)
        x = torch.arange(1, W + 1, device=device, dtype=torch.float32)
        y = (y / (y[-1] + self.eps) * self.scale).view(1, H, 1, 1)
        x = (x / (x[-1] + self.eps) * self.scale).view(1, 1, W, 1)
        dim_t = torch.arange(
            self.hidden_dim, device=device, dtype=torch.float32)
        dim_t = self.temperature**(
            2 * torch.div(dim_t, 2, rounding_mode='floor') / self.hidden_dim)
        pos_x = (x / dim_t).expand(1, H, W, self.hidden_dim)
        pos_y = (y / dim_t).expand(1, H, W, self.hidden_dim)
        pos_x = torch.stack([pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()],
                            dim=4).flatten(3)
        pos_y = torch.stack([pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()],
                            dim=4).flatten(3)
        # channels-last memory, as timm computes it (same conv kernel path)
        feats = torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)
        feats = feats.to(dtype)
        self._features[key] = feats
        if len(self._features) > self.cache_size:
            self._features.popitem(last=False)
        return feats

    def tokens(self, H: int, W: int) -> torch.Tensor:
        """The encoding as (1, H * W, dim) tokens (the 1x1 projection as a
        matrix product on channels-last features)."""
        proj = self.token_projection
        if torch.compiler.is_compiling():  # traced: no Python-side cache
            pos = PositionalEncodingFourier.forward(self, 1, H, W)
            return pos.flatten(2).transpose(1, 2)
        feats = self.fourier_features(H, W, proj.weight.device,
                                      proj.weight.dtype)
        feats = feats.permute(0, 2, 3, 1).reshape(1, H * W, -1)
        return F.linear(feats, proj.weight.flatten(1), proj.bias)

    def forward(self, B: int, H: int, W: int) -> torch.Tensor:
        weight = self.token_projection.weight
        feats = self.fourier_features(H, W, weight.device, weight.dtype)
        return self.token_projection(feats).expand(B, -1, -1, -1)


def _replace_batchnorm(module: nn.Module, norm_cfg: dict) -> None:
    """Replace every ``nn.BatchNorm2d`` below ``module`` by a layer built from
    ``norm_cfg`` (same parameter names, so checkpoints load unchanged)."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            setattr(module, name,
                    build_norm_layer(norm_cfg, child.num_features)[1])
        else:
            _replace_batchnorm(child, norm_cfg)


@MODELS.register_module()
class XCiT(Xcit, BaseModule):
    """XCiT backbone with a 4-level feature pyramid.

    Args:
        arch (str | None): Preset, named as timm's XCiT models without prefix
            and resolution: one of ``ARCH_SETTINGS`` (``'nano_12_p16'``,
            ``'small_12_p8'``, ``'medium_24_p16'``, ...). ``None`` builds
            from the explicit arguments alone. Defaults to ``'small_12_p16'``.
        patch_size (int, optional): 8 or 16. Overrides the preset.
        embed_dim (int, optional): Token channels. Overrides the preset.
        depth (int, optional): Number of XCA blocks. Overrides the preset.
        num_heads (int, optional): XCA heads. Overrides the preset.
        eta (float, optional): Layer-scale initial value. Overrides the preset.
        mlp_ratio (float): MLP hidden width over ``embed_dim``. Defaults to 4.
        qkv_bias (bool): Bias in the query/key/value projection.
            Defaults to True.
        in_channels (int): Input image channels. Defaults to 3.
        out_indices (Sequence[int], optional): Four strictly increasing block
            indices tapped for the pyramid levels of strides 4, 8, 16, 32.
            Defaults to ``(3, 5, 7, 11)`` for depth 12 and
            ``(7, 11, 15, 23)`` for depth 24. Blocks after the last tapped one
            are not built.
        drop_rate (float): Dropout after the positional encoding and in the
            projections. Defaults to 0.
        attn_drop_rate (float): Dropout on the XCA attention map.
            Defaults to 0.
        drop_path_rate (float): Stochastic depth rate, the same for every
            block as in the published models. Defaults to 0.
        use_pos_embed (bool): Add the Fourier positional encoding.
            Defaults to True.
        norm_cfg (dict): Normalisation of the stem, the local patch
            interaction and the pyramid. Defaults to ``dict(type='BN')``;
            use ``dict(type='SyncBN')`` or mmengine's ``sync_bn`` for
            multi-GPU training.
        frozen_stages (int): ``-1`` freezes nothing; ``0`` freezes the stem
            (patch embedding and positional encoding); ``k > 0`` freezes the
            stem and the first ``k`` blocks. Frozen parts get no gradient and
            keep their BatchNorm statistics. Defaults to -1.
        norm_eval (bool): Keep every BatchNorm in eval mode during training.
            Defaults to False.
        with_cp (bool): Gradient checkpointing of the blocks: less memory,
            same gradients, more compute. Defaults to False.
        compile_cfg (bool | dict, optional): Compile the backbone's forward
            with ``torch.compile`` on its first call: ``True`` for the
            defaults or a dict of ``torch.compile`` arguments (``mode``,
            ``dynamic``, ``backend``, ...). Defaults to None (eager).
        autocast_dtype (str, optional): ``'bfloat16'`` or ``'float16'``:
            run the backbone under ``torch.autocast`` of the input's device
            and return float32 maps, so the neck and heads stay in fp32 (on
            CPU, mmcv's NMS takes fp32 only). Defaults to None (the dtype
            of the caller: fp32, or the autocast already active).
        init_cfg (dict, optional): mmengine initialisation config.
            ``dict(type='Pretrained', checkpoint=PATH)`` imports an
            official, timm, DINO or xcit-dense checkpoint strictly (see
            :mod:`xcit_dense.checkpoint`); ``checkpoint_key`` picks
            ``'teacher'`` (default) or ``'student'`` from DINO files.
    """

    out_strides: Tuple[int, ...] = (4, 8, 16, 32)
    #: Tokens per piece in inference (no autograd): the token-wise layers
    #: and the pyramid's transposed convolutions run piece by piece. ``None``
    #: sizes the pieces of each layer so that its largest temporary (the
    #: MLP's hidden activations, the XCA input's normalised copy, ...) stays
    #: within ``inference_chunk_mib``.
    inference_chunk: Optional[int] = None
    inference_chunk_mib: float = 24

    def __init__(self,
                 arch: Optional[str] = DEFAULT_ARCH,
                 patch_size: Optional[int] = None,
                 embed_dim: Optional[int] = None,
                 depth: Optional[int] = None,
                 num_heads: Optional[int] = None,
                 eta: Optional[float] = None,
                 mlp_ratio: float = 4.,
                 qkv_bias: bool = True,
                 in_channels: int = 3,
                 out_indices: Optional[Sequence[int]] = None,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 use_pos_embed: bool = True,
                 norm_cfg: dict = dict(type='BN', requires_grad=True),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 compile_cfg: Union[bool, dict, None] = None,
                 autocast_dtype: Optional[str] = None,
                 init_cfg: Optional[dict] = None):
        settings = self.resolve_arch(
            arch, patch_size=patch_size, embed_dim=embed_dim, depth=depth,
            num_heads=num_heads, eta=eta)
        depth = settings['depth']
        out_indices = self.check_out_indices(out_indices, depth)
        if not -1 <= frozen_stages <= out_indices[-1] + 1:
            raise ValueError(
                f'frozen_stages must be in [-1, {out_indices[-1] + 1}] (-1: '
                f'none, 0: stem, k: stem and the first k blocks), got '
                f'{frozen_stages!r}')
        if compile_cfg is not None and not isinstance(compile_cfg,
                                                      (bool, dict)):
            raise ValueError(
                f'compile_cfg must be None, a bool or a dict of '
                f'torch.compile arguments, got {type(compile_cfg).__name__}')
        if autocast_dtype not in AUTOCAST_DTYPES:
            raise ValueError(
                f'autocast_dtype must be one of {AUTOCAST_DTYPES}, got '
                f'{autocast_dtype!r}')
        if init_cfg is not None and not isinstance(init_cfg, dict):
            raise ValueError(f'init_cfg must be a dict or None, got '
                             f'{type(init_cfg).__name__}')

        Xcit.__init__(
            self,
            patch_size=settings['patch_size'],
            in_chans=in_channels,
            num_classes=0,
            global_pool='',
            embed_dim=settings['embed_dim'],
            depth=depth,
            num_heads=settings['num_heads'],
            mlp_ratio=mlp_ratio,
            qkv_bias=qkv_bias,
            pos_drop_rate=drop_rate,
            proj_drop_rate=drop_rate,
            attn_drop_rate=attn_drop_rate,
            drop_path_rate=drop_path_rate,
            cls_attn_layers=0,
            use_pos_embed=use_pos_embed,
            eta=settings['eta'])
        # Xcit.__init__ ran BaseModule.__init__ through the MRO without
        # arguments; set what BaseModule keeps.
        self.init_cfg = dict(init_cfg) if init_cfg is not None else None

        self.arch = arch
        self.arch_settings = settings
        self.patch_size = settings['patch_size']
        self.depth = depth
        self.out_indices = out_indices
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.norm_cfg = dict(norm_cfg)

        # Classification parts (class token, class-attention blocks, final
        # norm, head) and the blocks after the last tap are not used.
        self.prune_intermediate_layers(
            list(out_indices), prune_norm=True, prune_head=True)
        self.cls_token = None  # timm < 1.0.31 keeps it when pruning the head
        self.num_prefix_tokens = 0
        if use_pos_embed:
            self.pos_embed = CachedFourierEncoding(dim=self.embed_dim)
        _replace_batchnorm(self.patch_embed, self.norm_cfg)
        _replace_batchnorm(self.blocks, self.norm_cfg)

        for level, stride in enumerate(self.out_strides, start=1):
            self.add_module(
                f'fpn{level}',
                self._make_resampler(self.patch_size / stride))
        self.feature_info = [
            dict(num_chs=self.embed_dim, reduction=stride,
                 module=f'fpn{level}')
            for level, stride in enumerate(self.out_strides, start=1)
        ]
        self.set_grad_checkpointing(with_cp)
        self.autocast_dtype = autocast_dtype
        self.compile_cfg = (None if compile_cfg is None or compile_cfg is
                            False else {} if compile_cfg is True else
                            dict(compile_cfg))
        self._freeze_stages()

    # ------------------------------------------------------------ arguments
    @staticmethod
    def resolve_arch(arch: Optional[str], **overrides) -> dict:
        """Preset settings with the explicit (non-None) overrides applied."""
        if arch is None:
            settings = {}
        elif isinstance(arch, str) and arch in ARCH_SETTINGS:
            settings = dict(ARCH_SETTINGS[arch])
        else:
            raise ValueError(
                f'Unknown XCiT arch {arch!r}; allowed: '
                f'{", ".join(ARCH_SETTINGS)} (or None with explicit '
                'patch_size, embed_dim, depth, num_heads)')
        settings.update({k: v for k, v in overrides.items() if v is not None})
        settings.setdefault('eta', 1.0 if settings.get('depth', 0) <= 12
                            else 1e-5)
        missing = [k for k in ('patch_size', 'embed_dim', 'depth',
                               'num_heads') if k not in settings]
        if missing:
            raise ValueError(f'arch=None needs explicit {", ".join(missing)}')
        if settings['patch_size'] not in PATCH_SIZES:
            raise ValueError(
                f'patch_size must be one of {PATCH_SIZES} (the convolutional '
                f'stem of XCiT), got {settings["patch_size"]!r}')
        for key in ('embed_dim', 'depth', 'num_heads'):
            if not isinstance(settings[key], int) or settings[key] < 1:
                raise ValueError(f'{key} must be a positive int, got '
                                 f'{settings[key]!r}')
        if settings['embed_dim'] % settings['num_heads']:
            raise ValueError(
                f'embed_dim ({settings["embed_dim"]}) must be divisible by '
                f'num_heads ({settings["num_heads"]})')
        return settings

    @classmethod
    def check_out_indices(cls, out_indices: Optional[Sequence[int]],
                          depth: int) -> Tuple[int, ...]:
        """Validate (or default) the four tapped block indices."""
        if out_indices is None:
            out_indices = DEFAULT_OUT_INDICES.get(depth) or tuple(
                # the same relative positions as the published depth-12 taps
                round((i + 1) * depth / 12) - 1 for i in (3, 5, 7, 11))
        out_indices = tuple(out_indices)
        n = len(cls.out_strides)
        if (len(out_indices) != n
                or not all(isinstance(i, int) for i in out_indices)
                or not all(0 <= i < depth for i in out_indices)
                or any(a >= b for a, b in zip(out_indices, out_indices[1:]))):
            raise ValueError(
                f'out_indices must be {n} strictly increasing block indices '
                f'in [0, {depth - 1}] (depth {depth}), one per pyramid level '
                f'of strides {cls.out_strides}; got {list(out_indices)}')
        return out_indices

    # ------------------------------------------------------------ pyramid
    def _make_resampler(self, scale: float) -> nn.Module:
        """Resampling of a tapped token map by ``scale`` (a power of two):
        transposed 2x2 convolutions up (norm and GELU between two), identity,
        or max-pooling down; as in the published XCiT detection backbone."""
        if scale == 1:
            return nn.Identity()
        if scale < 1:
            k = round(1 / scale)
            return nn.MaxPool2d(kernel_size=k, stride=k, ceil_mode=True)
        layers: List[nn.Module] = []
        for step in range(round(math.log2(scale))):
            if step:
                layers += [build_norm_layer(self.norm_cfg, self.embed_dim)[1],
                           nn.GELU()]
            layers.append(nn.ConvTranspose2d(
                self.embed_dim, self.embed_dim, kernel_size=2, stride=2))
        return nn.Sequential(*layers)

    @property
    def resamplers(self) -> List[nn.Module]:
        return [getattr(self, f'fpn{level}')
                for level in range(1, len(self.out_strides) + 1)]

    # ------------------------------------------------------------ forward
    # The forward pass computes what timm's blocks and the published pyramid
    # compute (``forward_reference``), with fewer FLOPs and memory passes:
    # tokens stay (B, N, C) = channels-last throughout (depth-wise
    # convolutions and norms run on channels-last views, no NCHW round
    # trips), layer-scale gammas and eval-mode BatchNorms are folded into the
    # adjacent weights, XCA is computed from the second moments of its input
    # and applied as one C x C matrix (two token GEMMs instead of four),
    # transposed 2x2 convolutions are token GEMMs plus one pixel shuffle, and
    # fp32 CPU runs on oneDNN kernels: fused GELU / residual epilogues in
    # inference, an MLP that recomputes its hidden activation in training
    # (:mod:`xcit_dense.models.kernels`).
    def _backend(self, x: torch.Tensor) -> str:
        return kernels.select_backend(x, self.training)

    def _stem(self, x: torch.Tensor) -> Tuple[torch.Tensor, int, int]:
        """Convolutional patch embedding; returns (B, N, C) tokens."""
        backend = self._backend(x)
        x = x.contiguous(memory_format=torch.channels_last)
        layers = list(self.patch_embed.proj)  # (conv, norm), GELU, ...
        for i in range(0, len(layers), 2):
            conv, norm = layers[i]
            act_layer = layers[i + 1] if i + 1 < len(layers) else None
            act = 'gelu' if _is_exact_gelu(act_layer) else None
            folded = _fold_batchnorm(conv.weight, conv.bias, norm)
            if folded is None:
                x = norm(conv(x))
                act = None
            else:
                x = kernels.conv2d(x, *folded, conv.stride, conv.padding,
                                   conv.groups, act=act, backend=backend)
            if act_layer is not None and act is None:
                x = act_layer(x)
        B, C, H, W = x.shape
        # channels-last NCHW is (B, H, W, C) in memory: a view, no copy
        return x.permute(0, 2, 3, 1).reshape(B, H * W, C), H, W

    def _chunk_tokens(self, x: torch.Tensor,
                      width: Optional[int] = None) -> int:
        """Tokens per piece in inference for a layer whose widest temporary
        has ``width`` channels per token (default: the MLP's hidden layer);
        the whole map (every token) when autograd records or a compiler
        traces."""
        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            return x.shape[1]
        if self.inference_chunk:
            return self.inference_chunk
        if width is None:
            width = self.blocks[0].mlp.fc1.out_features if len(self.blocks) \
                else 4 * self.embed_dim
        return max(1, int(self.inference_chunk_mib * 2**20) //
                   (width * x.element_size()))

    def _chunks(self, x: torch.Tensor,
                width: Optional[int] = None) -> List[slice]:
        """Token ranges processed one at a time: all at once when autograd
        records, otherwise equal pieces of at most ``_chunk_tokens`` (the
        token-wise layers then need no more memory than that, and no
        temporary is large enough for the allocator to hand it back to the
        OS and page-fault it in again on the next call)."""
        n = x.shape[1]
        pieces = -(-n // self._chunk_tokens(x, width))
        size = -(-n // pieces)
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def _block(self, blk: nn.Module, x: torch.Tensor, H: int,
               W: int) -> torch.Tensor:
        """One timm ``XCABlock`` on (B, N, C) tokens."""
        backend = self._backend(x)
        # XCA's temporaries are C wide, the MLP's hidden layer 4C
        x = self._xca(blk, x, self._chunks(x, width=x.shape[-1]), backend)
        x = self._lpi(blk, x, H, W, backend)
        return self._mlp(blk, x, self._chunks(x), backend)

    @staticmethod
    def _assemble(x: torch.Tensor, chunks: List[slice], compute) -> torch.Tensor:
        """``compute(slice)`` for every token range, joined along dim 1."""
        if len(chunks) == 1:
            return compute(chunks[0])
        out = torch.empty_like(x)
        for sl in chunks:
            out[:, sl] = compute(sl)
        return out

    def _xca(self, blk: nn.Module, x: torch.Tensor, chunks: List[slice],
             backend: str) -> torch.Tensor:
        """``x + gamma1 * XCA(norm1(x))``: softmax(q^T k / (|q||k|) * t) per
        head, applied to v and projected.

        q, k and v are affine in the normalised tokens z, so every channel
        product the attention needs follows from the (C x C) second moments
        ``z^T z`` and the column sums of z. The first pass over the tokens
        accumulates those (a C-wide GEMM per token instead of the 2C-wide q, k
        projection); the attention is formed at C x C cost and folded with the
        v projection and the output projection into one (C x C) matrix per
        image, which the second pass applies (one GEMM per token instead of
        two)."""
        attn = blk.attn
        B, N, C = x.shape
        heads = attn.num_heads
        d = C // heads
        normed = [blk.norm1(x)] if len(chunks) == 1 else None
        gram, total = 0, 0
        for sl in chunks:
            z = normed[0] if normed else blk.norm1(x[:, sl])
            gram = gram + kernels.gram(z)
            total = total + z.sum(dim=1, dtype=torch.float32)
        # for q = z W_q^T + b_q and k = z W_k^T + b_k (each N x C):
        # q^T k = W_q G W_k^T + (W_q s + N b_q) b_k^T + b_q (W_k s)^T and
        # |q_c|^2 = (W_q G W_q^T)_cc + b_c (2 (W_q s)_c + N b_c), G = z^T z,
        # s = z^T 1; the same for k
        w = attn.qkv.weight.float()
        w_qk, w_v = w[:2 * C], w[2 * C:]
        wg = torch.matmul(w_qk, gram)  # (B, 2C, C)
        ws = total @ w_qk.t()  # (B, 2C)
        sq = (wg * w_qk).sum(dim=-1)
        qk = torch.einsum('bhic,hjc->bhij', wg[:, :C].view(B, heads, d, C),
                          w_qk[C:].view(heads, d, C))
        b_v = None
        if attn.qkv.bias is not None:
            bias = attn.qkv.bias.float()
            b_qk, b_v = bias[:2 * C], bias[2 * C:]
            sq = sq + b_qk * (2 * ws + N * b_qk)
            qk = qk + ((ws[:, :C] + N * b_qk[:C]).view(B, heads, d, 1) *
                       b_qk[C:].view(heads, 1, d) +
                       b_qk[:C].view(heads, d, 1) *
                       ws[:, C:].view(B, heads, 1, d))
        # F.normalize's eps on the L2 norms of the q and k channels
        norm = sq.clamp_min(0).sqrt().clamp_min(1e-12).view(B, 2, heads, d)
        logits = qk / (norm[:, 0].unsqueeze(-1) * norm[:, 1].unsqueeze(-2))
        a = attn.attn_drop((logits * attn.temperature).softmax(dim=-1))
        # out = z (W_p A W_v)^T + W_p A b_v + b_p, A block-diagonal (heads),
        # gamma1 (layer scale) folded into W_p and b_p
        g1 = blk.gamma1.float()
        proj_w = attn.proj.weight.float() * g1.unsqueeze(1)
        pa = torch.einsum('ohi,bhij->bohj', proj_w.view(C, heads, d),
                          a).reshape(B, C, C)
        weight = pa @ w_v
        bias = (attn.proj.bias.float() * g1).expand(B, C)
        if b_v is not None:
            bias = bias + pa @ b_v
        weight, bias = weight.to(x.dtype), bias.to(x.dtype)

        def output(sl: slice) -> torch.Tensor:
            z = normed[0] if normed else blk.norm1(x[:, sl])
            xs = x[:, sl]
            if backend == 'torch':
                y = torch.baddbmm(bias.unsqueeze(1), z, weight.transpose(1, 2))
                return xs + blk.drop_path1(attn.proj_drop(y))
            # oneDNN: one GEMM per image (each has its own matrix), the
            # residual fused in eval (dropout, drop-path are identities)
            fused = backend == 'fused'
            outs = [kernels.linear(z[i], weight[i], bias[i],
                                   residual=xs[i] if fused else None,
                                   backend=backend) for i in range(B)]
            y = torch.stack(outs) if B > 1 else outs[0].unsqueeze(0)
            return y if fused else xs + blk.drop_path1(attn.proj_drop(y))

        return self._assemble(x, chunks, output)

    @staticmethod
    def _lpi(blk: nn.Module, x: torch.Tensor, H: int, W: int,
             backend: str) -> torch.Tensor:
        """``x + gamma3 * LPI(norm3(x))``, the depth-wise convolutions on a
        channels-last view of the tokens (no NCHW copies)."""
        B, N, C = x.shape
        lpi = blk.local_mp
        y = blk.norm3(x).view(B, H, W, C).permute(0, 3, 1, 2)
        act = 'gelu' if _is_exact_gelu(lpi.act) else None
        conv1, conv2 = lpi.conv1, lpi.conv2
        y = kernels.conv2d(y, conv1.weight, conv1.bias, conv1.stride,
                           conv1.padding, conv1.groups, act=act, backend=backend)
        if act is None:
            y = lpi.act(y)
        y = lpi.bn(y)
        g3 = blk.gamma3
        w2, b2 = conv2.weight * g3.view(-1, 1, 1, 1), conv2.bias * g3
        args = (conv2.stride, conv2.padding, conv2.groups)
        if backend == 'fused':  # eval mode: drop-path is the identity
            x_map = x.view(B, H, W, C).permute(0, 3, 1, 2)
            y = kernels.conv2d(y, w2, b2, *args, residual=x_map,
                               backend=backend)
            return y.permute(0, 2, 3, 1).reshape(B, N, C)
        y = kernels.conv2d(y, w2, b2, *args, backend=backend)
        return x + blk.drop_path3(y.permute(0, 2, 3, 1).reshape(B, N, C))

    def _mlp(self, blk: nn.Module, x: torch.Tensor, chunks: List[slice],
             backend: str) -> torch.Tensor:
        """``x + gamma2 * MLP(norm2(x))``, GELU and the residual fused into
        the two linear layers where the kernels allow."""
        mlp = blk.mlp
        act = 'gelu' if _is_exact_gelu(mlp.act) else None
        g2 = blk.gamma2
        w2, b2 = mlp.fc2.weight * g2.unsqueeze(1), mlp.fc2.bias * g2

        plain = act is not None and isinstance(mlp.norm, nn.Identity) and (
            not self.training or mlp.drop1.p == mlp.drop2.p == 0)

        def output(sl: slice) -> torch.Tensor:
            xs = x[:, sl]
            if plain:  # fc1, GELU, fc2 as one kernel call
                fused = backend == 'fused'  # eval: drop-path is the identity
                y = kernels.mlp(blk.norm2(xs), mlp.fc1.weight, mlp.fc1.bias,
                                w2, b2, residual=xs if fused else None,
                                backend=backend)
                return y if fused else xs + blk.drop_path2(y)
            y = kernels.linear(blk.norm2(xs), mlp.fc1.weight, mlp.fc1.bias,
                               act=act, backend=backend)
            if act is None:
                y = mlp.act(y)
            y = mlp.norm(mlp.drop1(y))
            if backend == 'fused':  # eval: dropout, drop-path are identities
                return kernels.linear(y, w2, b2, residual=xs,
                                      backend=backend)
            y = kernels.linear(y, w2, b2, backend=backend)
            return xs + blk.drop_path2(mlp.drop2(y))

        return self._assemble(x, chunks, output)

    def _checkpointing(self) -> bool:
        """``with_cp`` applies: set, and autograd is recording."""
        return self.grad_checkpointing and torch.is_grad_enabled()

    def forward_tokens(
            self, x: torch.Tensor) -> Tuple[List[torch.Tensor], int, int]:
        """Outputs of the blocks in ``out_indices`` as (B, N, C) tokens, and
        the token grid height and width."""
        x, H, W = self._stem(x)
        if self.pos_embed is not None:
            x = x + self.pos_embed.tokens(H, W)
        x = self.pos_drop(x)
        taps = []
        checkpointing = self._checkpointing()
        for i, blk in enumerate(self.blocks):
            if checkpointing:
                x = checkpoint(self._block, blk, x, H, W, use_reentrant=False)
            else:
                x = self._block(blk, x, H, W)
            if i in self.out_indices:
                taps.append(x)
        return taps, H, W

    def forward_taps(self, x: torch.Tensor) -> List[torch.Tensor]:
        """Outputs of the blocks in ``out_indices`` as NCHW token maps."""
        taps, H, W = self.forward_tokens(x)
        return [_tokens_to_nchw(t, H, W) for t in taps]

    def _resample(self, resampler: nn.Module, x: torch.Tensor, H: int,
                  W: int) -> torch.Tensor:
        """Apply a pyramid resampler to (B, N, C) tokens; NCHW result."""
        if not isinstance(resampler, nn.Sequential):  # Identity / MaxPool2d
            return resampler(_tokens_to_nchw(x, H, W))
        backend = self._backend(x)
        B, C = x.shape[0], x.shape[-1]
        layers = list(resampler)
        for i in range(0, len(layers), 3):
            up = layers[i]
            weight, bias = up.weight, up.bias  # (C_in, C_out, 2, 2)
            last = i + 1 == len(layers)
            folded, act = None, None
            if not last:
                folded = _fold_batchnorm(weight.transpose(0, 1), bias,
                                         layers[i + 1])
                if folded is not None:
                    weight, bias = folded[0].transpose(0, 1), folded[1]
                    if _is_exact_gelu(layers[i + 2]):
                        act = 'gelu'
            x = self._upsample2x(x, weight, bias, act, H, W, nchw=last,
                                 backend=backend)
            H, W = 2 * H, 2 * W
            if last:
                return x
            if folded is None:  # norm and activation as modules
                y = layers[i + 1](x.view(B, H, W, C).permute(0, 3, 1, 2))
                y = layers[i + 2](y)
                x = y.permute(0, 2, 3, 1).reshape(B, H * W, C)
            elif act is None:
                x = layers[i + 2](x)
        raise AssertionError('unreachable: resampler ends with a transposed '
                             'convolution')

    def _upsample2x(self, x: torch.Tensor, weight: torch.Tensor,
                    bias: torch.Tensor, act: Optional[str], H: int, W: int,
                    nchw: bool, backend: str) -> torch.Tensor:
        """2x2 stride-2 transposed convolution of (B, H*W, C) tokens as a
        token GEMM and a pixel shuffle, by bands of rows when not recording
        gradients. Returns (B, 4*H*W, C) tokens or, with ``nchw``, an NCHW
        map."""
        B, C_out = x.shape[0], weight.shape[1]
        if nchw and act is None and not torch.is_grad_enabled():
            return self._upsample2x_nchw(x, weight, bias, H, W, backend)
        if nchw:  # GEMM columns (C_out, ky, kx)
            w_mat = weight.flatten(1).t()
            b_vec = bias.repeat_interleave(4)
            out = x.new_empty(B, C_out, 2 * H, 2 * W)
            dst = out.view(B, C_out, H, 2, W, 2)
        else:  # GEMM columns (ky, kx, C_out)
            w_mat = weight.permute(2, 3, 1, 0).flatten(0, 2)
            b_vec = bias.repeat(4)
            out = x.new_empty(B, 4 * H * W, C_out)
            dst = out.view(B, H, 2, W, 2, C_out)
        rows = max(1, min(H, self._chunk_tokens(x) // W))
        bands = [slice(r, min(r + rows, H)) for r in range(0, H, rows)]
        for band in bands:
            y = kernels.linear(x[:, band.start * W:band.stop * W], w_mat,
                               b_vec, act=act, backend=backend)
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

    def _upsample2x_nchw(self, x: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor, H: int, W: int,
                         backend: str) -> torch.Tensor:
        """:meth:`_upsample2x` to an NCHW map without autograd: the GEMM is
        computed transposed, ``(C_out, ky, kx) x tokens``, so that the pixel
        shuffle interleaves two contiguous rows per output row (``kx``)
        instead of gathering pairs of values a token apart, and adds the bias
        as it writes."""
        B, C_out = x.shape[0], weight.shape[1]
        w_mat = weight.flatten(1).t().contiguous()  # rows (C_out, ky, kx)
        if torch.compiler.is_compiling():  # one kernel writes the output
            y = torch.stack([kernels.linear(w_mat, x[b], None,
                                            backend=backend)
                             for b in range(B)]).view(B, C_out, 2, 2, H, W)
            y = y + bias.view(1, C_out, 1, 1, 1, 1)
            return y.permute(0, 1, 4, 2, 5, 3).reshape(B, C_out, 2 * H,
                                                        2 * W)
        out = x.new_empty(B, C_out, 2 * H, 2 * W)
        dst = out.view(B, C_out, H, 2, W, 2)
        bias = bias.view(C_out, 1, 1, 1)
        rows = max(1, min(H, self._chunk_tokens(x) // W))
        for b in range(B):
            for r in range(0, H, rows):
                band = slice(r, min(r + rows, H))
                y = kernels.linear(w_mat, x[b, r * W:band.stop * W], None,
                                   backend=backend)
                y = y.view(C_out, 2, 2, band.stop - r, W)
                for kx in range(2):  # (C_out, rows, ky, W), W stride 2
                    torch.add(y[:, :, kx].transpose(1, 2), bias,
                              out=dst[b, :, band, :, :, kx])
        return out

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        if self.autocast_dtype is not None and \
                not torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type,
                                dtype=getattr(torch, self.autocast_dtype)):
                outs = self._forward_maybe_compiled(x)
            return tuple(o.float() for o in outs)
        return self._forward_maybe_compiled(x)

    def _forward_maybe_compiled(
            self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        if self.compile_cfg is not None and \
                not torch.compiler.is_compiling():
            compiled = self.__dict__.get('_compiled_forward')
            if compiled is None:  # compiled lazily, on the first call
                compiled = torch.compile(type(self)._forward_pyramid,
                                         **self.compile_cfg)
                self.__dict__['_compiled_forward'] = compiled
            return compiled(self, x)
        return self._forward_pyramid(x)

    def _forward_pyramid(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        H, W = x.shape[-2:]
        taps, Hp, Wp = self.forward_tokens(x)
        outs = []
        for tap, resampler, stride in zip(taps, self.resamplers,
                                          self.out_strides):
            y = self._resample(resampler, tap, Hp, Wp)
            outs.append(_crop(y, H, W, stride))
        return tuple(outs)

    def forward_reference(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """The published design computed the straightforward way: timm's
        patch embedding and ``XCABlock.forward`` (unfused XCA, NCHW round
        trips in LPI), the positional encoding recomputed on every call, taps
        reshaped to NCHW, and the pyramid modules called as they are. Same
        parameters and outputs as :meth:`forward`; kept as the baseline of
        the tests and of ``tools/benchmark.py``."""
        H, W = x.shape[-2:]
        B = x.shape[0]
        x, (Hp, Wp) = self.patch_embed(x)
        if self.pos_embed is not None:
            pos = PositionalEncodingFourier.forward(self.pos_embed, B, Hp, Wp)
            x = x + pos.reshape(B, -1, x.shape[1]).permute(0, 2, 1)
        x = self.pos_drop(x)
        outs = []
        checkpointing = self._checkpointing()
        for i, blk in enumerate(self.blocks):
            if checkpointing:
                x = checkpoint(blk, x, Hp, Wp, use_reentrant=False)
            else:
                x = blk(x, Hp, Wp)
            if i in self.out_indices:
                stride = self.out_strides[len(outs)]
                tap = x.reshape(B, Hp, Wp, -1).permute(0, 3, 1, 2).contiguous()
                y = self.resamplers[len(outs)](tap)
                outs.append(_crop(y, H, W, stride))
        return tuple(outs)

    # ------------------------------------------------------------ training
    def _frozen_modules(self) -> List[nn.Module]:
        if self.frozen_stages < 0:
            return []
        stem = [self.patch_embed, self.pos_drop]
        if self.pos_embed is not None:
            stem.append(self.pos_embed)
        return stem + list(self.blocks[:self.frozen_stages])

    def _freeze_stages(self) -> None:
        for module in self._frozen_modules():
            module.eval()
            for param in module.parameters():
                param.requires_grad = False

    def train(self, mode: bool = True) -> 'XCiT':
        super().train(mode)
        if mode:
            for module in self._frozen_modules():
                module.eval()
            if self.norm_eval:
                for module in self.modules():
                    if isinstance(module, _BatchNorm):
                        module.eval()
        return self

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """Names of the parameters trained without weight decay: the XCA
        temperatures, the positional encoder, the layer-scale gammas and all
        normalisation layers."""
        names = set()
        for module_name, module in self.named_modules():
            if isinstance(module, (nn.LayerNorm, nn.GroupNorm, _BatchNorm)):
                names.update(f'{module_name}.{p}'
                             for p, _ in module.named_parameters(
                                 recurse=False))
        for name, _ in self.named_parameters():
            leaf = name.rsplit('.', 1)[-1]
            if name.startswith('pos_embed.') or leaf == 'temperature' or (
                    leaf.startswith('gamma') and leaf[5:].isdigit()):
                names.add(name)
        return names

    # ------------------------------------------------------------ weights
    def init_weights(self) -> None:
        """Initialise; with ``init_cfg=dict(type='Pretrained', ...)`` import
        the checkpoint strictly (never a silent partial load)."""
        if self.init_cfg is not None and \
                self.init_cfg.get('type') == 'Pretrained':
            from ..checkpoint import load_backbone_checkpoint
            cfg = dict(self.init_cfg)
            cfg.pop('type')
            checkpoint = cfg.pop('checkpoint', None)
            if checkpoint is None:
                raise ValueError(
                    "init_cfg of type 'Pretrained' needs a 'checkpoint' path")
            load_backbone_checkpoint(
                self, checkpoint, logger=MMLogger.get_current_instance(),
                **cfg)
            self._is_init = True
            return
        super().init_weights()
