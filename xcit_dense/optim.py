"""Optimizer wrapper constructor: the modules' no-decay lists, parameter
groups merged where their options are the same and, opt-in, layer-wise
learning-rate decay."""
import itertools
from collections import defaultdict
from typing import Callable, Dict, List, Optional, Set, Tuple

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper

from .errors import UserError
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


def merging(groups: List[dict],
            options: Callable[[dict], dict]) -> List[List[int]]:
    """Which of ``groups`` (optimizer parameter groups) merge: the indices
    of those of equal ``options(group)``, one list per merged group, in the
    order each first came."""
    merged: List[Tuple[dict, List[int]]] = []
    for i, group in enumerate(groups):
        opts = options(group)
        for seen, members in merged:
            if seen == opts:
                members.append(i)
                break
        else:
            merged.append((opts, [i]))
    return [members for _, members in merged]


def merged_groups(groups: List[dict],
                  merged: List[List[int]]) -> List[dict]:
    """``groups`` merged as ``merged`` (:func:`merging`) says, each merged
    group's parameters in their order, its options its first member's (all
    equal)."""
    return [dict(groups[members[0]], params=[
        p for i in members for p in groups[i]['params']])
        for members in merged]


def _options_of(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != 'params'}


def saved_merging(saved: List[dict], optimizer: torch.optim.Optimizer
                  ) -> Optional[List[List[int]]]:
    """How the parameter groups of a saved optimizer state (one group per
    parameter: mmengine's constructor, ours before it merged groups) merge
    into ``optimizer``'s, or None where they do not (as many groups, or
    other sizes once merged)."""
    if len(saved) <= len(optimizer.param_groups):
        return None
    members = merging(saved, _options_of)
    sizes = [sum(len(saved[i]['params']) for i in m) for m in members]
    if sizes != [len(g['params']) for g in optimizer.param_groups]:
        return None
    return members


def _merge_saved_groups(optimizer: torch.optim.Optimizer,
                        state_dict: dict) -> Optional[dict]:
    """A load_state_dict pre-hook: an optimizer state saved with one group
    per parameter loads into the merged groups of the same parameters, its
    groups merged the same way (:func:`saved_merging`). Any other mismatch
    is left to :func:`_groups_as_saved`."""
    saved = state_dict.get('param_groups', [])
    members = saved_merging(saved, optimizer)
    if members is None:
        return None
    return dict(state_dict, param_groups=merged_groups(saved, members))


def _groups_as_saved(optimizer: torch.optim.Optimizer,
                     state_dict: dict) -> None:
    """A load_state_dict pre-hook, after :func:`_merge_saved_groups`: an
    optimizer state whose parameter groups are not this optimizer's
    (another number of them, or other sizes: the groups' rules changed
    since it was saved) is one paragraph that says so and what to do,
    where the optimizer's own error names neither."""
    saved = state_dict.get('param_groups')
    if not isinstance(saved, list):
        return
    sizes = [len(group.get('params', ())) for group in saved]
    ours = [len(group['params']) for group in optimizer.param_groups]
    if sizes == ours:
        return
    raise UserError(
        f'The optimizer state being loaded has {_groups(sizes)} and this '
        f"run's optimizer {_groups(ours)}: the parameter groups changed "
        'since the checkpoint was saved (optim_wrapper.paramwise_cfg: '
        'custom_keys, layer_decay_rate, merge_groups and the like, or the '
        "model's parameters), so each parameter's moments cannot be placed. "
        'Resume with the settings the checkpoint was saved with, or start '
        'from its weights alone with load_from=PATH instead of --resume '
        '(the optimizer and the schedules then start afresh).')


def _groups(sizes: List[int]) -> str:
    """``sizes`` (parameters per group) in words."""
    if len(sizes) > 4:
        return (f'{len(sizes)} parameter groups of {min(sizes)} to '
                f'{max(sizes)} parameters' if min(sizes) < max(sizes) else
                f'{len(sizes)} parameter groups of {sizes[0]} parameter'
                f'{"s" if sizes[0] != 1 else ""} each')
    return (f'{len(sizes)} parameter group{"s" if len(sizes) != 1 else ""} '
            f'of {", ".join(map(str, sizes))} parameters')


def merge_saved_schedulers(checkpoint: dict,
                           optimizer: torch.optim.Optimizer) -> None:
    """In a checkpoint being resumed whose optimizer state has one group per
    parameter where ``optimizer`` has them merged: its parameter schedulers'
    per-group values (mmengine's ``base_values``, which the cosine
    schedulers read, and ``_last_value``) are made those of the merged
    groups (their first members'), as the optimizer's state is by its load
    pre-hook."""
    saved = (checkpoint.get('optimizer') or {}).get('param_groups')
    members = saved and saved_merging(saved, optimizer)
    schedulers = checkpoint.get('param_schedulers')
    if not members or not isinstance(schedulers, list):  # dict: several
        return  # optimizers, which the runner's one optimizer is not
    for state, key in itertools.product(schedulers,
                                        ('base_values', '_last_value')):
        values = state.get(key)
        if isinstance(values, list) and len(values) == len(saved):
            state[key] = [values[m[0]] for m in members]


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
    ``paramwise_cfg=dict(apply_no_weight_decay=False)`` leaves the lists
    out (mmengine's rules alone): the recipes do, to train with the
    published ``custom_keys`` rule.

    ``paramwise_cfg=dict(layer_decay_rate=r)`` (``0 < r <= 1``) scales the
    learning rate of layer ``l`` by ``r ** (top - l)`` as in BEiT and ViTDet:
    the stem and positional encoding are layer 0, block ``i`` is layer
    ``i + 1``, everything after the last block (pyramid, neck, heads) is the
    top, ``num_layers + 1`` (see :meth:`xcit_dense.XCiT.layer_id`). It
    multiplies whatever lr the other rules gave a parameter. The log shows one
    line per (layer, weight decay) group.

    mmengine's constructor makes one parameter group per parameter (352 for
    Mask R-CNN XCiT-S12/16), and the optimizer runs its update once per
    group: on a GPU hundreds of launches of tiny kernels where one per
    group of the same options would do. The groups whose options are the
    same (learning rate, weight decay, any other option a rule set) are
    merged (2 for that model: with and without weight decay), which changes
    no parameter's update; an optimizer state saved with one group per
    parameter still loads (and its schedulers' states resume:
    ``CheckpointImportHook``). ``paramwise_cfg=dict(merge_groups=False)``
    keeps one group per parameter.
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
        self.merge_groups = paramwise_cfg.pop('merge_groups', True)
        if not isinstance(self.merge_groups, bool):
            raise ValueError('paramwise_cfg.merge_groups must be True (merge '
                             'the parameter groups of the same options) or '
                             f'False; got {self.merge_groups!r}.')
        self.apply_no_weight_decay = paramwise_cfg.pop(
            'apply_no_weight_decay', True)
        if not isinstance(self.apply_no_weight_decay, bool):
            raise ValueError(
                'paramwise_cfg.apply_no_weight_decay must be True (no weight '
                "decay on what the modules' no_weight_decay() names) or False "
                "(mmengine's rules alone); got "
                f'{self.apply_no_weight_decay!r}.')
        super().__init__(optim_wrapper_cfg, paramwise_cfg)

    def __call__(self, model: nn.Module) -> OptimWrapper:
        module = model.module if hasattr(model, 'module') else model
        no_decay = (no_weight_decay_params(module)
                    if self.apply_no_weight_decay else set())
        self._no_decay = {
            id(p) for name, p in module.named_parameters() if name in no_decay
        }
        self._layers: Optional[Tuple[Dict[int, int], int]] = None
        if self.layer_decay_rate is not None:
            self._layers = parameter_layers(module)
        # mmengine applies paramwise rules (and add_params, which the
        # no-decay list extends) only when paramwise_cfg is given
        self.paramwise_cfg = dict(self.paramwise_cfg or {})
        self.paramwise_cfg.setdefault('custom_keys', {})
        wrapper = super().__call__(model)
        # plain dicts, as torch.optim makes them: mmengine builds the
        # optimizer from a ConfigDict, which turns the groups into
        # ConfigDicts, and dynamo cannot trace a step over those (mmengine's
        # ``compile=True`` compiles the step with the train_step)
        groups = wrapper.optimizer.param_groups
        groups[:] = [dict(group) for group in groups]
        if self.merge_groups:
            wrapper.optimizer.register_load_state_dict_pre_hook(
                _merge_saved_groups)
        wrapper.optimizer.register_load_state_dict_pre_hook(
            _groups_as_saved)
        return wrapper

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
        if self.merge_groups:
            merged = merged_groups(groups, merging(groups, self._options))
            print_log(
                f'{len(groups)} parameter groups, merged into {len(merged)} '
                'of distinct options (paramwise_cfg.merge_groups=False '
                'keeps them apart)', logger='current')
            params[first:] = merged

    def _options(self, group: dict) -> dict:
        """What the optimizer will use for ``group``: the optimizer config's
        options, overridden by the group's own."""
        options = {k: v for k, v in self.optimizer_cfg.items() if k != 'type'}
        options.update(_options_of(group))
        return options

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
        for (layer, scale, wd), (n, numel) in sorted(
                summary.items(), key=lambda item: (item[0][0], str(item[0]))):
            # no weight_decay in the config: the optimizer's own default
            decay = 'the optimizer\'s default' if wd is None else f'{wd:g}'
            print_log(
                f'  layer {layer:2d}: lr scale {scale:.6g}, weight decay '
                f'{decay}, {n} tensors, {numel} parameters',
                logger='current')
