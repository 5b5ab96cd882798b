"""The XCiT backbone for dense prediction: Cross-Covariance Image
Transformers (El-Nouby et al., 2021, https://arxiv.org/abs/2106.09681) with
the 4-level pyramid of the published detection backbone.

The backbone calls its parts: the stem (:mod:`.stem`), the Fourier
positional encoding (:mod:`.positional_encoding`), the XCA blocks
(:mod:`.block`) and the pyramid resamplers (:mod:`.pyramid`), each owning its
fast path beside its straightforward computation; a part replaced, wrapped or
subclassed runs as its own ``forward`` says. It imports neither mmdet nor
mmseg; both build it as ``dict(type='xcit_dense.XCiT', ...)``.
"""
import re
from functools import partial
from typing import List, Optional, Sequence, Set, Tuple, Union

import torch
import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.model import BaseModule
from timm.layers import trunc_normal_
from torch.nn.modules.batchnorm import _BatchNorm

from ..checkpoint import load_backbone_checkpoint
from ..checkpoint.keys import read_published_names
from ..registry import MODELS
from .block import XCABlock
from .execution import init_execution, run_forward
from .inputs import check_image_size, check_images
from .ops.grad_layout import keep_grad_layouts, look_at_parameters_again
from .policy import check_setting as check_fast_path_setting
from .positional_encoding import CachedFourierEncoding
from .presets import (
    DEFAULT_ARCH,
    OUT_STRIDES,
    check_layer_args,
    check_norm_cfg,
    check_outputs,
    check_training_args,
    pretrained_as_init_cfg,
    resolve_arch,
    split_pretrained,
)
from .pyramid import crop, make_resampler
from .stem import ConvPatchEmbed


@MODELS.register_module()
class XCiT(BaseModule):
    """XCiT backbone with a 4-level feature pyramid (every argument with its
    examples: docs/backbone.md).

    Args:
        arch (str | None): Preset, named as timm's XCiT models without prefix
            and resolution (``'nano_12_p16'``, ``'small_12_p8'``, ...; see
            ``ARCH_SETTINGS``); ``None``: the explicit arguments alone.
            Defaults to ``'small_12_p16'``.
        patch_size, embed_dim, depth, num_heads, eta (optional): Override
            the preset: patch size (8 or 16), token channels, XCA blocks,
            heads and the layer-scale initial value.
        mlp_ratio (float): MLP hidden width over ``embed_dim``. Defaults to 4.
        qkv_bias (bool): Bias in the query/key/value projection.
            Defaults to True.
        in_channels (int): Input image channels. Defaults to 3.
        out_indices (Sequence[int], optional): Four strictly increasing block
            indices tapped for the strides 4, 8, 16, 32. Defaults to
            ``(3, 5, 7, 11)`` (depth 12), ``(7, 11, 15, 23)`` (depth 24);
            blocks after the last one tapped are not built.
        out_levels (Sequence[int]): The levels returned, indices into the
            strides 4, 8, 16, 32; the others are not built.
            Defaults to ``(0, 1, 2, 3)``.
        out_sizes (str): ``'published'``: the levels' sizes of the published
            backbone (facebookresearch/xcit: the token grid up-sampled or
            max-pooled rounding down); ``'ceil'`` (ours): ``ceil(H / s) x
            ceil(W / s)``. Equal for sides that are multiples of 32.
            Defaults to ``'published'``.
        drop_rate, attn_drop_rate, drop_path_rate (float): Dropout after the
            positional encoding and in the projections, on the attention
            map, and stochastic depth (the same for every block, as
            published). Default to 0.
        use_pos_embed (bool): Add the Fourier positional encoding.
            Defaults to True.
        norm_cfg (dict): Normalisation of the stem, the local patch
            interaction and the pyramid. Defaults to ``dict(type='BN')``.
        frozen_stages (int): ``-1`` nothing frozen; ``0`` the stem and the
            positional encoding; ``k > 0`` those and the first ``k``
            blocks. Defaults to -1.
        norm_eval (bool): Keep every BatchNorm in eval mode during training.
            Defaults to False.
        with_cp (bool): Gradient checkpointing per block. Defaults to False.
        compile_cfg (bool | str | dict, optional): ``torch.compile`` the
            forward on its first call: ``True``, a dict of its arguments, or
            ``'auto'`` (where :data:`~.policy.COMPILE` lists it as faster);
            a failure warns once and runs eagerly. Defaults to None.
        autocast_dtype (str, optional): ``'bfloat16'`` or ``'float16'``:
            the backbone under ``torch.autocast``, returning float32 maps
            (bf16 on a CPU without native bf16 runs in fp32, saying so
            once). Defaults to None (the caller's dtype).
        fast_path (bool | str): ``True``: each part's fast path where
            :data:`~.policy.POLICY` says it pays; ``'always'``: wherever it
            can run; ``False``: the straightforward computation everywhere.
            Defaults to True.
        cuda_graphs (bool | str): Replay on CUDA from CUDA graphs: ``True``
            inference, ``'train'`` training steps too, ``'auto'`` what
            :data:`~.policy.GRAPHS` lists. Defaults to False.
        init_cfg (dict | list[dict], optional): mmengine's; a
            ``'Pretrained'`` entry imports an official, timm, DINO or
            xcit-dense checkpoint strictly (:mod:`xcit_dense.checkpoint`).
        pretrained (str, optional): Deprecated, as in mmdet's and mmseg's
            backbones: ``init_cfg=dict(type='Pretrained', checkpoint=...)``.
    """

    out_strides: Tuple[int, ...] = OUT_STRIDES

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
                 out_levels: Sequence[int] = (0, 1, 2, 3),
                 out_sizes: str = 'published',
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 use_pos_embed: bool = True,
                 norm_cfg: dict = dict(type='BN', requires_grad=True),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 compile_cfg: Union[bool, str, dict, None] = None,
                 autocast_dtype: Optional[str] = None,
                 fast_path: Union[bool, str] = True,
                 cuda_graphs: Union[bool, str] = False,
                 pretrained: Optional[str] = None,
                 init_cfg: Union[dict, Sequence[dict], None] = None):
        init_cfg = pretrained_as_init_cfg(pretrained, init_cfg)
        settings = resolve_arch(
            arch, patch_size=patch_size, embed_dim=embed_dim, depth=depth,
            num_heads=num_heads, eta=eta)
        out_indices, out_levels = check_outputs(
            out_indices, out_levels, out_sizes, settings['depth'])
        taps = [out_indices[level] for level in out_levels]  # the blocks'
        check_layer_args(in_channels, mlp_ratio, qkv_bias, use_pos_embed,
                         drop_rate, attn_drop_rate, norm_eval, with_cp)
        check_norm_cfg(norm_cfg)
        check_training_args(frozen_stages, taps[-1], compile_cfg,
                            autocast_dtype, init_cfg, cuda_graphs,
                            drop_path_rate)
        super().__init__(init_cfg=init_cfg)
        self.arch, self.arch_settings = arch, settings
        self.patch_size = settings['patch_size']
        self.embed_dim = self.num_features = dim = settings['embed_dim']
        self.depth, self.out_indices = settings['depth'], out_indices
        self.out_levels, self.out_sizes = out_levels, out_sizes
        self.out_strides = tuple(OUT_STRIDES[level] for level in out_levels)
        self.frozen_stages, self.norm_eval = frozen_stages, norm_eval
        self.norm_cfg = dict(norm_cfg)
        # how the forward runs: read by run_forward on every call
        init_execution(self, compile_cfg, autocast_dtype, cuda_graphs)

        self.patch_embed = ConvPatchEmbed(
            patch_size=self.patch_size, in_chans=in_channels, embed_dim=dim,
            norm_cfg=self.norm_cfg)
        self.pos_embed = (CachedFourierEncoding(dim=dim) if use_pos_embed
                          else None)
        self.pos_drop = nn.Dropout(p=drop_rate)
        self._add_blocks(taps[-1] + 1, num_heads=settings['num_heads'],
                         mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                         proj_drop=drop_rate, attn_drop=attn_drop_rate,
                         drop_path=drop_path_rate, eta=settings['eta'])
        # every loader (load_state_dict, mmengine's, mmdet's and mmseg's)
        # takes a published detector or segmentor as it is
        self.register_load_state_dict_pre_hook(read_published_names)
        self._add_resamplers()
        self.set_grad_checkpointing(with_cp)
        self.set_fast_path(fast_path)
        self._freeze_stages()

    def _add_blocks(self, count: int, **block_args) -> None:
        """The XCA blocks up to the last one tapped, their linear layers
        initialised as timm's."""
        self.blocks = nn.ModuleList(
            XCABlock(self.embed_dim, norm_cfg=self.norm_cfg,
                     norm_layer=partial(nn.LayerNorm, eps=1e-6),
                     **block_args) for _ in range(count))
        self.blocks.apply(_init_linear)

    def _add_resamplers(self) -> None:
        """``fpn1`` (stride 4) ... ``fpn4`` (stride 32), those of the levels
        returned."""
        for level in self.out_levels:
            self.add_module(f'fpn{level + 1}', make_resampler(
                self.embed_dim, self.patch_size / OUT_STRIDES[level],
                self.norm_cfg, self.out_sizes))

    # ------------------------------------------------------------ switches
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Gradient checkpointing of every block (``with_cp``)."""
        for blk in self.blocks:
            blk.with_cp = enable

    @property
    def grad_checkpointing(self) -> bool:
        return any(getattr(blk, 'with_cp', False) for blk in self.blocks)

    def set_fast_path(self, enabled: Union[bool, str] = True) -> None:
        """Every part's fast-path switch (the ``fast_path`` argument);
        :func:`xcit_dense.fast_path` switches all models at once."""
        self.fast_path = check_fast_path_setting(enabled)
        for module in self.modules():
            if hasattr(module, 'use_fast_path'):
                module.use_fast_path = self.fast_path

    @property
    def resamplers(self) -> List[nn.Module]:
        """The resamplers of the levels returned (``fpn1`` ... ``fpn4``)."""
        return [getattr(self, f'fpn{level + 1}') for level in self.out_levels]

    # ------------------------------------------------------------ forward
    @property
    def in_channels(self) -> int:
        """Channels of the images taken: those of the stem's first
        convolution (a stem replaced or edited is asked)."""
        return next(m.in_channels for m in self.patch_embed.modules()
                    if isinstance(m, nn.Conv2d))

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """NCHW images -> NCHW maps of strides 4, 8, 16, 32 (those of
        ``out_levels``), of the sizes that ``out_sizes`` says."""
        check_images(self, x)
        check_image_size(self, x)
        if torch.is_grad_enabled():  # DDP's buckets: see ops/grad_layout.py
            keep_grad_layouts(self)
        return run_forward(self, x)  # autocast, compiled, graphed or eager

    def _forward_pyramid(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        H, W = x.shape[-2:]
        outs = []
        for tap, resampler, stride in zip(self._taps(x),
                                          self.resamplers, self.out_strides):
            level = resampler(tap)
            if self.out_sizes == 'ceil':  # ours: ceil(H / s) x ceil(W / s)
                level = crop(level, H, W, stride)
            outs.append(level.contiguous())
        return tuple(outs)

    def forward_taps(self, x: torch.Tensor) -> List[torch.Tensor]:
        """Outputs of the blocks tapped for the levels returned
        (``out_indices`` of ``out_levels``) as (B, C, Hp, Wp) maps on the
        token grid: channels-last views of the (B, N, C) tokens."""
        check_images(self, x)
        return self._taps(x)

    def _taps(self, x: torch.Tensor) -> List[torch.Tensor]:
        B = x.shape[0]
        x, (Hp, Wp) = self.patch_embed(x)
        if self.pos_embed is not None:
            pos = self.pos_embed(B, Hp, Wp)
            x = x + pos.flatten(2).transpose(1, 2)
        x = self.pos_drop(x)
        taps, tapped = [], {self.out_indices[level]
                            for level in self.out_levels}
        for i, blk in enumerate(self.blocks):
            x = blk(x, Hp, Wp)
            if i in tapped:
                taps.append(x.reshape(B, Hp, Wp, -1).permute(0, 3, 1, 2))
        return taps

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
            look_at_parameters_again(self)  # a module swapped since
            if self.cuda_graphs == 'auto':  # validation's graphs: memory
                self.graphs.release()
            for module in self._frozen_modules():
                module.eval()
            if self.norm_eval:
                for module in self.modules():
                    if isinstance(module, _BatchNorm):
                        module.eval()
        return self

    def no_weight_decay(self) -> Set[str]:
        """Names of the parameters trained without weight decay (timm's
        interface; our ``paramwise_cfg.apply_no_weight_decay`` option): the
        XCA temperatures, the positional encoder, the layer-scale gammas and
        all normalisation layers."""
        norms = (nn.LayerNorm, nn.GroupNorm, _BatchNorm)
        return {name for name, module, leaf in _named_leaves(self)
                if isinstance(module, norms) or leaf == 'temperature'
                or name.startswith('pos_embed.')
                or re.fullmatch(r'gamma\d+', leaf)}

    def layer_id(self, name: str) -> int:
        """Depth of the parameter ``name`` (relative to the backbone) for
        layer-wise learning-rate decay, as in BEiT and ViTDet: 0 for the stem
        and the positional encoding, ``i + 1`` for block ``i``, the top
        (:attr:`num_layers` ``+ 1``) for everything else (the pyramid, a
        detector's neck and heads, any other name, as timm's groups do)."""
        if name.startswith(('patch_embed.', 'pos_embed.')):
            return 0
        block = re.match(r'blocks\.(\d+)(\.|$)', name)
        if block is not None:
            return int(block.group(1)) + 1
        return self.num_layers + 1

    @property
    def num_layers(self) -> int:
        """Blocks built (those up to the last tapped one)."""
        return len(self.blocks)

    # ------------------------------------------------------------ weights
    def init_weights(self) -> None:
        """mmengine's initialisation (``init_cfg``); a ``'Pretrained'``
        entry, applied after the others as mmengine orders them, imports its
        checkpoint strictly (:mod:`xcit_dense.checkpoint`)."""
        others, pretrained = split_pretrained(self.init_cfg)
        if pretrained is None:
            return super().init_weights()
        init_cfg, self.init_cfg = self.init_cfg, others
        try:
            super().init_weights()
        finally:
            self.init_cfg = init_cfg
        load_backbone_checkpoint(self, logger=MMLogger.get_current_instance(),
                                 **pretrained)
        self._is_init = True


def _init_linear(module: nn.Module) -> None:
    """timm's initialisation of XCiT's linear layers."""
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=.02)
        if module.bias is not None:
            nn.init.constant_(module.bias, 0)


def _named_leaves(model: nn.Module):
    """``(full name, owning module, own name)`` of every parameter."""
    for module_name, module in model.named_modules():
        for leaf, _ in module.named_parameters(recurse=False):
            yield (f'{module_name}.{leaf}' if module_name else leaf,
                   module, leaf)
