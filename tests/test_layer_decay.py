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
    from xcit_dense.benchmark.builders import optim_wrapper_config
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
    norms = {f'{name}.{p}' for name, m in model.named_modules()
             if isinstance(m, (nn.LayerNorm, nn.GroupNorm,
                               nn.modules.batchnorm._BatchNorm))
             for p, _ in m.named_parameters(recurse=False)}
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
        leaf = name.rsplit('.', 1)[-1]
        no_decay = name in norms or leaf == 'temperature' or re.fullmatch(
            r'gamma\d', leaf) or name.startswith('backbone.pos_embed.')
        assert group['weight_decay'] == (0. if no_decay else base_wd), name
    assert seen == set(names.values())
    assert len(model.backbone.blocks) == depth
    out = '\n'.join(records)
    assert f'Layer-wise lr decay {rate} over {top + 1} layers' in out
    assert re.search(rf'layer {top}: lr scale 1, weight decay {base_wd:g}, '
                     r'\d+ tensors, \d+ parameters', out)
    assert re.search(r'layer  0: lr scale [\d.e-]+, weight decay 0, ', out)


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
