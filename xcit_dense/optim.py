"""Optimizer wrapper constructor: the modules' no-decay lists and, opt-in,
layer-wise learning-rate decay."""
from collections import defaultdict
from typing import Dict, List, Optional, Set, Tuple

import torch.nn as nn
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper

from .registry import OPTIM_WRAPPER_CONSTRUCTORS


def no_weight_decay_params(model: nn.Module) -> Set[str]:
    """Full names of the parameters that modules of ``model`` declare
    decay-free through a timm-style ``no_weight_decay()`` method."""
    names: Set[str] = set()
    for prefix, module in model.named_modules():
        fn = getattr(module, 'no_weight_decay', None)
        if callable(fn):
            names.update(f'{prefix}.{n}' if prefix else n for n in fn())
    return names


def parameter_layers(model: nn.Module) -> Tuple[Dict[int, int], int]:
    """Layer of every parameter of ``model`` for layer-wise lr decay, keyed
    by ``id(param)``, and the top layer.

    The depth comes from the one module of ``model`` with a ``layer_id(name)``
    method and a ``num_layers`` attribute (the XCiT backbone); parameters
    outside it (neck, heads) are at the top, ``num_layers + 1``.
    """
    layered = [(prefix, module) for prefix, module in model.named_modules()
               if callable(getattr(module, 'layer_id', None))
               and hasattr(module, 'num_layers')]
    if len(layered) != 1:
        found = ', '.join(p or '(the model)' for p, _ in layered) or 'none'
        raise ValueError(
            'paramwise_cfg.layer_decay_rate needs exactly one backbone that '
            'defines the layer of each parameter (layer_id() and '
            f'num_layers, as xcit_dense.XCiT does); found {found}.')
    prefix, backbone = layered[0]
    top = backbone.num_layers + 1
    layers = {id(p): top for p in model.parameters()}
    for name, param in backbone.named_parameters():
        layers[id(param)] = backbone.layer_id(name)
    return layers, top


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class NoDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's default constructor, plus weight decay 0 for every parameter
    a module lists in its ``no_weight_decay()``, plus optional layer-wise
    learning-rate decay.

    For XCiT the no-decay list is the XCA temperatures, the positional
    encoder, the layer-scale gammas and the normalisation layers, so configs
    need no hand-typed ``custom_keys``. All other ``paramwise_cfg`` options
    work as in mmengine; a ``custom_keys`` entry that sets ``decay_mult``
    takes precedence for the parameters it matches.

    ``paramwise_cfg=dict(layer_decay_rate=r)`` (``0 < r <= 1``) scales the
    learning rate of layer ``l`` by ``r ** (top - l)`` as in BEiT and ViTDet:
    the stem and positional encoding are layer 0, block ``i`` is layer
    ``i + 1``, everything after the last block (pyramid, neck, heads) is the
    top, ``num_layers + 1`` (see :meth:`xcit_dense.XCiT.layer_id`). It
    multiplies whatever lr the other rules gave a parameter. The log shows one
    line per (layer, weight decay) group.
    """

    def __init__(self, optim_wrapper_cfg: dict,
                 paramwise_cfg: Optional[dict] = None):
        paramwise_cfg = dict(paramwise_cfg or {})
        rate = paramwise_cfg.pop('layer_decay_rate', None)
        if rate is not None and (isinstance(rate, bool) or not isinstance(
                rate, (int, float)) or not 0 < rate <= 1):
            raise ValueError(
                'paramwise_cfg.layer_decay_rate must be a number in (0, 1] '
                '(the lr of layer l is lr * rate ** (top - l)); got '
                f'{rate!r}.')
        self.layer_decay_rate = rate
        super().__init__(optim_wrapper_cfg, paramwise_cfg)

    def __call__(self, model: nn.Module) -> OptimWrapper:
        module = model.module if hasattr(model, 'module') else model
        no_decay = no_weight_decay_params(module)
        self._no_decay = {
            id(p) for name, p in module.named_parameters() if name in no_decay
        }
        self._layers: Optional[Tuple[Dict[int, int], int]] = None
        if self.layer_decay_rate is not None:
            self._layers = parameter_layers(module)
        # Per-parameter groups are needed even without other paramwise rules.
        self.paramwise_cfg = dict(self.paramwise_cfg or {})
        self.paramwise_cfg.setdefault('custom_keys', {})
        return super().__call__(model)

    def add_params(self,
                   params: List[dict],
                   module: nn.Module,
                   prefix: str = '',
                   is_dcn_module: Optional[float] = None) -> None:
        first = len(params)
        super().add_params(params, module, prefix, is_dcn_module)
        if prefix:
            return  # the root call below sees every group
        groups = params[first:]
        if self.base_wd is not None:
            for group in groups:
                if 'decay_mult' in group:
                    continue  # set explicitly by a custom key
                if any(id(p) in self._no_decay for p in group['params']):
                    group['weight_decay'] = 0.
        if self._layers is not None:
            self._decay_by_layer(groups)

    def _decay_by_layer(self, groups: List[dict]) -> None:
        layers, top = self._layers
        rate = self.layer_decay_rate
        summary: Dict[tuple, List[int]] = defaultdict(lambda: [0, 0])
        for group in groups:
            (layer, ) = {layers[id(p)] for p in group['params']}
            scale = rate**(top - layer)
            group['lr'] = group.get('lr', self.base_lr) * scale
            group['layer_id'], group['lr_scale'] = layer, scale
            wd = group.get('weight_decay', self.base_wd)
            entry = summary[(layer, scale, wd)]
            entry[0] += 1
            entry[1] += sum(p.numel() for p in group['params'])
        print_log(
            f'Layer-wise lr decay {rate} over {top + 1} layers (0: stem and '
            f'positional encoding, 1-{top - 1}: blocks, {top}: pyramid, '
            'neck and heads):', logger='current')
        for (layer, scale, wd), (n, numel) in sorted(summary.items()):
            print_log(
                f'  layer {layer:2d}: lr scale {scale:.6g}, weight decay '
                f'{wd:g}, {n} tensors, {numel} parameters', logger='current')
