"""Optimizer wrapper constructor that honours the modules' no-decay lists."""
from typing import List, Optional, Set

import torch.nn as nn
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


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class NoDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's default constructor, plus weight decay 0 for every parameter
    a module lists in its ``no_weight_decay()``.

    For XCiT that is the XCA temperatures, the positional encoder, the
    layer-scale gammas and the normalisation layers, so configs need no
    hand-typed ``custom_keys``. All other ``paramwise_cfg`` options work as in
    mmengine; a ``custom_keys`` entry that sets ``decay_mult`` takes
    precedence for the parameters it matches.
    """

    def __call__(self, model: nn.Module) -> OptimWrapper:
        module = model.module if hasattr(model, 'module') else model
        no_decay = no_weight_decay_params(module)
        self._no_decay = {
            id(p) for name, p in module.named_parameters() if name in no_decay
        }
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
        if prefix or self.base_wd is None:
            return  # the root call below sees every group
        for group in params[first:]:
            if 'decay_mult' in group:
                continue  # set explicitly by a custom key
            if any(id(p) in self._no_decay for p in group['params']):
                group['weight_decay'] = 0.
