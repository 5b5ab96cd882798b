"""Layer-wise learning-rate decay of NoDecayOptimWrapperConstructor
(``paramwise_cfg=dict(layer_decay_rate=r)``), in mmdet and mmseg configs."""
import re

import pytest
import torch.nn as nn

from conftest import REPO, logged


def _build(config, rate):
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper

    import xcit_dense  # noqa: F401
    from benchmarks.harness.builders import optim_wrapper_config
    from xcit_dense.toolkits import use_toolkit
    cfg = Config.fromfile(str(REPO / config))
    cfg.model.backbone.init_cfg = None
    model = use_toolkit(cfg.default_scope).MODELS.build(cfg.model)
    wrapper = optim_wrapper_config(cfg.optim_wrapper, amp=False,
                                   device='cpu')
    wrapper['paramwise_cfg'] = dict(wrapper.get('paramwise_cfg') or {},
                                    layer_decay_rate=rate)
    return model, build_optim_wrapper(model, wrapper), cfg


@pytest.mark.parametrize('config,depth', [
    ('configs/coco/mask_rcnn_xcit_t12_p16_3x_coco.py', 12),
    ('configs/coco/mask_rcnn_xcit_s24_p8_3x_coco.py', 24),
    ('configs/ade20k/upernet_xcit_t12_p8_160k_ade20k.py', 12),
    ('configs/ade20k/sem_fpn_xcit_s24_p16_80k_ade20k.py', 24),
])
def test_lr_and_weight_decay_follow_the_formula(config, depth):
    rate = 0.75
    with logged() as records:
        model, wrapper, cfg = _build(config, rate)
    base_lr = cfg.optim_wrapper.optimizer.lr
    base_wd = cfg.optim_wrapper.optimizer.weight_decay
    names = {id(p): n for n, p in model.named_parameters()}
    top = depth + 1
    seen = set()
    groups = wrapper.optimizer.param_groups
    # one group per (layer, weight decay): the parameters' groups merged
    assert len({(g['lr'], g['weight_decay']) for g in groups}) == \
        len(groups) < len(names)
    for group, param in ((g, p) for g in groups for p in g['params']):
        name = names[id(param)]
        seen.add(name)
        if name.startswith(('backbone.patch_embed.', 'backbone.pos_embed.')):
            layer = 0
        elif name.startswith('backbone.blocks.'):
            layer = int(name.split('.')[2]) + 1
        else:
            layer = top
        assert group['lr'] == pytest.approx(base_lr * rate**(top - layer)), \
            name
        # the recipe's weight decay, kept: none on the names with 'norm'
        assert group['weight_decay'] == (
            0. if 'norm' in name else base_wd), name
    assert seen == set(names.values())
    assert len(model.backbone.blocks) == depth
    out = '\n'.join(records)
    assert f'Layer-wise lr decay {rate} over {top + 1} layers' in out
    assert re.search(rf'layer {top}: lr scale 1, weight decay {base_wd:g}, '
                     r'\d+ tensors, \d+ parameters', out)
    assert re.search(r'layer  0: lr scale [\d.e-]+, weight decay '
                     rf'{base_wd:g}, ', out)
    assert re.search(r'layer  1: lr scale [\d.e-]+, weight decay 0, ', out)


@pytest.mark.parametrize('rate', [0, 1.5, 'x', True])
def test_bad_rate_is_refused(rate):
    from xcit_dense import NoDecayOptimWrapperConstructor
    with pytest.raises(ValueError, match=r'layer_decay_rate must be a number '
                       r'in \(0, 1\]'):
        NoDecayOptimWrapperConstructor(
            dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1)),
            dict(layer_decay_rate=rate))


def test_model_without_xcit_is_refused():
    from xcit_dense import NoDecayOptimWrapperConstructor
    constructor = NoDecayOptimWrapperConstructor(
        dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1)),
        dict(layer_decay_rate=0.9))
    with pytest.raises(ValueError, match='exactly one backbone'):
        constructor(nn.Linear(2, 2))


def test_parameters_outside_numbered_blocks_are_the_top_layer():
    """A parameter a user adds under ``blocks`` but outside a numbered block
    (a prompt, say) goes to the top layer, as timm's layer-decay groups put
    the names their matchers miss; numbered blocks keep their depth."""
    import torch

    from xcit_dense import NoDecayOptimWrapperConstructor, XCiT
    backbone = XCiT(arch='nano_12_p16', depth=4, out_indices=(0, 1, 2, 3))
    for name, layer in [('patch_embed.proj.0.0.weight', 0),
                        ('blocks.0.attn.qkv.weight', 1),
                        ('blocks.2.gamma1', 3), ('blocks.2', 3),
                        ('blocks.prompt', 5), ('blocks.x.weight', 5),
                        ('blocks_extra.0.weight', 5), ('fpn1.0.weight', 5)]:
        assert backbone.layer_id(name) == layer, name
    backbone.blocks.register_parameter('prompt',
                                       nn.Parameter(torch.zeros(4, 128)))
    model = nn.Module()
    model.backbone = backbone
    with logged() as records:  # no weight_decay: AdamW's default
        wrapper = NoDecayOptimWrapperConstructor(
            dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.)),
            dict(layer_decay_rate=0.5))(model)
    group = next(g for g in wrapper.optimizer.param_groups
                 if any(p is backbone.blocks.prompt for p in g['params']))
    assert group['lr'] == 1. and group['weight_decay'] == 0.01
    assert re.search(r"layer  5: lr scale 1, weight decay the optimizer's "
                     r'default, \d+ tensors', '\n'.join(records))
