"""The published detection backbone as a benchmark row (``@published``).

facebookresearch/xcit's ``detection/backbone/xcit.py`` (or
``semantic_segmentation/backbone/xcit.py``, which differs in its imports),
loaded from the file ``tools/benchmark.py --published-code`` names and run
as it is written: nothing of it is part of this package. It imports three
names that mmcv 2.x and mmdet 3.x / mmseg 1.x no longer have; the loader
gives it stand-ins for those alone (:func:`load_published_code`), and its
own ``init_weights`` initialises it (as mmdet 2.x's training set-up
called it, without a checkpoint). Its outputs
are compared with the straightforward computation's on its own weights
(:func:`straightforward_twin`), so a row says both how fast and how exact
the published code is beside ours.
"""
import builtins
import inspect
import os.path as osp
import types
import warnings

import torch.nn as nn

from xcit_dense.errors import UserError, first_line

#: the published code's backbone class
CLASS = 'XCiT'


class _Backbones:
    """``BACKBONES.register_module()`` of mmdet 2.x: here the class as it
    is (nothing builds it from a config)."""

    @staticmethod
    def register_module(*args, **kwargs):
        return lambda cls: cls


def _stand_ins() -> dict:
    """What the published code imports from mmcv 1.x and mmdet 2.x (mmseg
    0.x): mmengine's ``load_checkpoint`` and current logger, and a
    registry that leaves the class as it is."""
    from mmengine.logging import MMLogger
    from mmengine.runner import load_checkpoint

    def get_root_logger(*args, **kwargs):
        return MMLogger.get_current_instance()

    utils = types.SimpleNamespace(get_root_logger=get_root_logger)
    builder = types.SimpleNamespace(BACKBONES=_Backbones())
    return {'mmcv.runner': types.SimpleNamespace(
                load_checkpoint=load_checkpoint),
            'mmdet.utils': utils, 'mmseg.utils': utils,
            'mmdet.models.builder': builder, 'mmseg.models.builder': builder}


def load_published_code(path: str) -> types.ModuleType:
    """The module of the published file at ``path``, its imports of the
    names of :func:`_stand_ins` answered by them (and nothing else
    changed: no module of the process is replaced)."""
    if not osp.isfile(path):
        raise UserError(
            f'--published-code {path}: no such file. Give the published '
            f'backbone file, detection/backbone/xcit.py of '
            f'https://github.com/facebookresearch/xcit.')
    with open(path) as f:
        source = f.read()
    stand_ins = _stand_ins()

    def importer(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name in stand_ins:
            return stand_ins[name]
        return builtins.__import__(name, globals, locals, fromlist, level)

    module = types.ModuleType('published_xcit')
    module.__file__ = path
    module.__builtins__ = dict(vars(builtins), __import__=importer)
    with warnings.catch_warnings():
        # timm's old module paths (timm.models.layers, .registry)
        warnings.simplefilter('ignore', FutureWarning)
        try:
            exec(compile(source, path, 'exec'), module.__dict__)
        except Exception as error:  # the file's own, whatever it is
            raise UserError(
                f'--published-code {path}: loading it failed '
                f'({first_line(error)}); give detection/backbone/xcit.py of '
                f'facebookresearch/xcit.') from error
    cls = getattr(module, CLASS, None)
    if not isinstance(cls, type) or \
            'out_indices' not in inspect.signature(cls).parameters:
        raise UserError(
            f'--published-code {path}: it defines no {CLASS} class with '
            f'pyramid taps (out_indices), as the published dense backbone '
            f'does (the repository\'s top-level xcit.py is the classifier); '
            f'give detection/backbone/xcit.py of facebookresearch/xcit.')
    return module


def build_published(path: str, arch: str) -> nn.Module:
    """The published backbone of the preset ``arch`` as the published
    detection configs build it (``mask_rcnn_xcit_small_12_p16_3x_coco.py``:
    patch size, width, depth, heads, ``mlp_ratio=4``, ``qkv_bias=True``,
    eta, the taps of its depth), without stochastic depth (as the
    benchmark's XCiT rows), initialised by its own ``init_weights``."""
    from xcit_dense.models.presets import ARCH_SETTINGS, DEFAULT_OUT_INDICES
    settings = ARCH_SETTINGS[arch]
    model = getattr(load_published_code(path), CLASS)(
        patch_size=settings['patch_size'], embed_dim=settings['embed_dim'],
        depth=settings['depth'], num_heads=settings['num_heads'],
        mlp_ratio=4, qkv_bias=True, eta=settings['eta'], drop_path_rate=0.,
        out_indices=list(DEFAULT_OUT_INDICES[settings['depth']]))
    model.init_weights()
    return model


def straightforward_twin(published: nn.Module, arch: str) -> nn.Module:
    """Our straightforward computation (``XCiT(fast_path=False)``) with the
    published model's weights, loaded as a published checkpoint is
    (strictly, ``pos_embeder`` renamed)."""
    from xcit_dense.checkpoint.backbone import convert_state_dict
    from xcit_dense.models import XCiT
    twin = XCiT(arch=arch, fast_path=False)
    state, _ = convert_state_dict(published.state_dict())
    twin.load_state_dict(state)
    return twin
