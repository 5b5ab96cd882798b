"""Every recipe trains with its source's hyper-parameters: the optimizer as
mmengine's Runner builds it from the config, parameter by parameter against
the source's rule computed here from the parameter names; the warm-up and
schedule stepped as the Runner steps them against the published formula.

Sources: facebookresearch/xcit ``detection/configs/xcit/
mask_rcnn_xcit_*_3x_coco.py`` (on ``_base_/schedules/schedule_1x.py``) and
``semantic_segmentation/configs/xcit/{upernet,sem_fpn}/*.py``, mmcv 1.3;
for the heads without an XCiT recipe, mmdet 3.3's ConvNeXt cascade and
Swin Mask2Former configs and mmseg 1.2's Swin Mask2Former config."""
import copy
import logging
import math
import re

import pytest
import torch.nn as nn
from mmengine.config import Config

from conftest import REPO
from models_meta import on_meta

RECIPES = sorted(p for task in ('coco', 'ade20k')
                 for p in (REPO / 'configs' / task).glob('*.py')
                 if not p.name.startswith('demo_'))
NORMS = (nn.modules.batchnorm._BatchNorm,
         nn.modules.instancenorm._InstanceNorm, nn.GroupNorm, nn.LayerNorm)

# The published XCiT recipes, mmcv 1.x: AdamW; custom_keys={'norm':
# dict(decay_mult=0.)}, matched as a substring of each parameter's full
# name; lr_config: a linear warm-up (lr x (ratio + (1 - ratio) t / iters))
# on top of the step or poly policy.
ADAMW = dict(type='AdamW', betas=(0.9, 0.999))
XCIT_COCO = dict(
    wrapper='AmpOptimWrapper',  # the published use_fp16=True
    optimizer=dict(ADAMW, lr=1e-4, weight_decay=0.05),
    schedule=[dict(type='LinearLR', start_factor=0.001, by_epoch=False,
                   begin=0, end=500),
              dict(type='MultiStepLR', begin=0, end=36, by_epoch=True,
                   milestones=[27, 33], gamma=0.1)],
    loop=dict(max_epochs=36), batch_size=2)


def xcit_ade20k(max_iters):
    return dict(
        wrapper='OptimWrapper',
        optimizer=dict(ADAMW, lr=6e-5, weight_decay=0.01),
        schedule=[dict(type='LinearLR', start_factor=1e-6, by_epoch=False,
                       begin=0, end=1500),
                  dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False,
                       begin=0, end=max_iters)],
        loop=dict(max_iters=max_iters), batch_size=2)


# mmdet's mask2former_r50_8xb2-lsj-50e_coco-panoptic.py and mmseg's
# mask2former_r50_8xb2-160k_ade20k-512x512.py, under their Swin configs
MASK2FORMER = dict(wrapper='OptimWrapper', clip_grad=dict(
    max_norm=0.01, norm_type=2), batch_size=2, optimizer=dict(
        ADAMW, lr=1e-4, weight_decay=0.05, eps=1e-8))
SOURCES = {
    'mask_rcnn': XCIT_COCO,
    'cascade_mask_rcnn': XCIT_COCO,  # XCiT's Mask R-CNN recipe
    'upernet': xcit_ade20k(160000),
    'sem_fpn': xcit_ade20k(80000),
    'mask2former_coco': dict(MASK2FORMER, loop=dict(max_iters=368750),
                             schedule=[dict(
                                 type='MultiStepLR', begin=0, end=368750,
                                 by_epoch=False, milestones=[327778, 355092],
                                 gamma=0.1)]),
    'mask2former_ade20k': dict(MASK2FORMER, loop=dict(max_iters=160000),
                               schedule=[dict(
                                   type='PolyLR', eta_min=0, power=0.9,
                                   begin=0, end=160000, by_epoch=False)]),
}


def family(path):
    head = re.match(r'(cascade_mask_rcnn|mask_rcnn|upernet|sem_fpn|'
                    r'mask2former)_', path.name).group(1)
    return f'{head}_{path.parent.name}' if head == 'mask2former' else head


def layer(name, depth):
    """The layer of lr decay, from the name (BEiT's and ViTDet's, which the
    cascade recipe's layer_decay_rate follows): stem and positional
    encoding 0, block i i + 1, all else the top."""
    found = re.match(r'backbone\.blocks\.(\d+)\.', name)
    if found:
        return int(found.group(1)) + 1
    return 0 if name.startswith(('backbone.patch_embed.',
                                 'backbone.pos_embed.')) else depth + 1


def source_rule(kind, cfg, model):
    """(lr, weight decay) of each parameter by the source's rule, computed
    from the names (and, for mmengine's norm_decay_mult, the layer types)
    alone."""
    lr, wd = (SOURCES[kind]['optimizer'][k] for k in ('lr', 'weight_decay'))
    in_norm_layer = {f'{m}.{n}' if m else n for m, module in
                     model.named_modules() if isinstance(module, NORMS)
                     for n, _ in module.named_parameters(recurse=False)}
    depth = len(model.backbone.blocks)
    rate = cfg.optim_wrapper.paramwise_cfg.get('layer_decay_rate', 1.)
    rule = {}
    for name, _ in model.named_parameters():
        if not kind.startswith('mask2former'):
            # published XCiT: 'norm' anywhere in the name, no weight decay
            rule[name] = (lr * rate**(depth + 1 - layer(name, depth)),
                          0. if 'norm' in name else wd)
        elif name.startswith('backbone.'):  # Swin's: its norms at 0
            rule[name] = (lr * 0.1, 0. if 'norm' in name else wd)
        elif re.search('query_embed|query_feat|level_embed', name):
            rule[name] = (lr, 0.)
        else:  # norm_decay_mult=0.0
            rule[name] = (lr, 0. if name in in_norm_layer else wd)
    return rule


_MODELS = {}


def _names_only(node):
    """``node`` (a model config) without what changes no parameter's name:
    widths (the backbone's preset, then its depth and patch size alone,
    and every ``in_channels`` but its length), drop path, eta, weights."""
    from xcit_dense import ARCH_SETTINGS
    if isinstance(node, dict):
        node = {k: _names_only(v) for k, v in node.items() if k not in (
            'drop_path_rate', 'eta', 'init_cfg')}
        if node.get('type') == 'xcit_dense.XCiT':
            preset = ARCH_SETTINGS[node.pop('arch')]
            node.update(depth=preset['depth'],
                        patch_size=preset['patch_size'])
        if isinstance(node.get('in_channels'), list):
            node['in_channels'] = len(node['in_channels'])
        elif 'in_channels' in node:
            node['in_channels'] = 1
        return node
    return [_names_only(v) for v in node] if isinstance(node, list) else node


def _model(default_scope, model_cfg):
    """A model with the recipe's parameter names, on the meta device (no
    memory, no initialisation) with the backbone 32 channels wide (names
    depend on depth and patch size, not width): built once for all the
    recipes of those names (each size of a head and patch size)."""
    from xcit_dense.toolkits import use_toolkit
    key = (default_scope, repr(_names_only(model_cfg.to_dict())))
    if key not in _MODELS:
        narrow = copy.deepcopy(model_cfg)
        narrow.backbone.update(embed_dim=32, num_heads=4, init_cfg=None)
        with on_meta():
            _MODELS[key] = use_toolkit(default_scope).MODELS.build(narrow)
    return _MODELS[key]


def built_as_the_runner_builds(cfg):
    """The model and the optimizer wrapper the Runner builds from ``cfg``
    (``build_optim_wrapper`` in the config's default scope), the wrapper in
    fp32 as tools/train.py makes it without a GPU."""
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope

    from xcit_dense.runner import without_amp
    inner = cfg.model.module if 'module' in cfg.model else cfg.model
    model = _model(cfg.default_scope, inner)
    init_default_scope(cfg.default_scope)
    wrapper = copy.deepcopy(cfg.optim_wrapper)
    without_amp(wrapper)
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)  # mmengine logs every parameter
    try:
        return model, build_optim_wrapper(model, wrapper)
    finally:
        logger.setLevel(level)


def published_factor(kind, t):
    """The lr of iteration ``t`` over the base lr, mmcv 1.x's LrUpdaterHook:
    the warm-up multiplies the regular (step or poly) lr."""
    warmup = SOURCES[kind]['schedule'][0]
    ratio, iters = warmup['start_factor'], warmup['end']
    factor = 1. if t >= iters else ratio + (1 - ratio) * t / iters
    if kind in ('upernet', 'sem_fpn'):
        factor *= 1 - t / SOURCES[kind]['loop']['max_iters']
    return factor


def check_warmup(kind, cfg, wrapper, steps):
    """The config's iteration-based schedulers, built and stepped as
    mmengine's ParamSchedulerHook steps them, give every group the
    published lr at each of the first ``steps`` iterations: during the
    warm-up within 1 / (iters - 1) of it (mmengine's LinearLR reaches the
    full lr at iteration ``end - 1``, mmcv's warm-up at ``warmup_iters``),
    after it within 1e-6 (its PolyLR likewise reaches 0 at ``end - 1``)."""
    from mmengine.registry import PARAM_SCHEDULERS
    schedulers = [PARAM_SCHEDULERS.build(dict(s, optimizer=wrapper))
                  for s in cfg.param_scheduler if not s.by_epoch]
    groups = wrapper.optimizer.param_groups
    base = [g['initial_lr'] for g in groups]
    iters = SOURCES[kind]['schedule'][0]['end']
    for t in range(steps):
        expected = published_factor(kind, t)
        rel = 1 / (iters - 1) if t < iters else 1e-6
        off = [g['lr'] for g, lr in zip(groups, base)
               if abs(g['lr'] - lr * expected) > rel * lr * expected]
        assert not off, (t, off[0], base[0] * expected)
        for scheduler in schedulers:
            scheduler.step()


def unscoped(settings):
    """A config's dict without the scope mmengine notes in what a base of
    another package sets."""
    return {k: v for k, v in settings.items() if k != '_scope_'}


@pytest.mark.parametrize('path', RECIPES, ids=lambda p: p.name)
def test_recipe_trains_as_its_source(path):
    kind = family(path)
    source = SOURCES[kind]
    cfg = Config.fromfile(str(path))
    wrapper_cfg = cfg.optim_wrapper
    assert wrapper_cfg.type == source['wrapper']
    assert wrapper_cfg.get('clip_grad') == source.get('clip_grad')
    assert unscoped(wrapper_cfg.optimizer) == source['optimizer']
    schedule = cfg.param_scheduler
    schedule = [schedule] if isinstance(schedule, dict) else schedule
    assert [unscoped(s) for s in schedule] == source['schedule']
    assert {k: cfg.train_cfg[k] for k in source['loop']} == source['loop']
    assert cfg.train_dataloader.batch_size == source['batch_size']
    assert cfg.auto_scale_lr.base_batch_size == 16  # 8 GPUs x 2

    model, wrapper = built_as_the_runner_builds(cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    built = {names[id(p)]: (g['lr'], g['weight_decay'])
             for g in wrapper.optimizer.param_groups for p in g['params']}
    rule = source_rule(kind, cfg, model)
    assert built.keys() == rule.keys()
    differ = [(n, built[n], rule[n]) for n in rule
              if built[n][1] != rule[n][1]
              or not math.isclose(built[n][0], rule[n][0], rel_tol=1e-12)]
    assert not differ, f'{len(differ)} parameters, e.g. {differ[:5]}'
    # the rule's 'norm' parameters of the backbone are the published
    # model's: the blocks' LayerNorms (its checkpoint keys)
    exempt = {n for n in rule if n.startswith('backbone.') and 'norm' in n}
    assert exempt == {f'backbone.blocks.{i}.norm{j}.{w}'
                      for i in range(len(model.backbone.blocks))
                      for j in (1, 2, 3) for w in ('weight', 'bias')}
    if source['schedule'][0]['type'] == 'LinearLR':
        check_warmup(kind, cfg, wrapper,
                     steps=source['schedule'][0]['end'] + 100)


def test_apply_no_weight_decay_must_be_a_bool():
    from xcit_dense import NoDecayOptimWrapperConstructor
    with pytest.raises(ValueError, match='apply_no_weight_decay must be '
                       r'True .* or False'):
        NoDecayOptimWrapperConstructor(
            dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1)),
            dict(apply_no_weight_decay='no'))
