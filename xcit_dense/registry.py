"""Registries of the ``xcit_dense`` scope.

They are children of mmengine's root registries, so a config of any scope
(``mmdet``, ``mmseg``) can name our modules as ``xcit_dense.XCiT``: mmengine
imports this module on the first look-up of the ``xcit_dense`` scope and then
imports the ``locations`` below, which register the classes.
"""
from mmengine.registry import DATA_SAMPLERS as MMENGINE_DATA_SAMPLERS
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import LOOPS as MMENGINE_LOOPS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import (
    OPTIM_WRAPPER_CONSTRUCTORS as MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS,
)
from mmengine.registry import TASK_UTILS as MMENGINE_TASK_UTILS
from mmengine.registry import TRANSFORMS as MMENGINE_TRANSFORMS
from mmengine.registry import Registry

DATA_SAMPLERS = Registry(
    'data sampler', parent=MMENGINE_DATA_SAMPLERS, scope='xcit_dense',
    locations=['xcit_dense.training'])
LOOPS = Registry(
    'loop', parent=MMENGINE_LOOPS, scope='xcit_dense',
    locations=['xcit_dense.training'])
HOOKS = Registry(
    'hook', parent=MMENGINE_HOOKS, scope='xcit_dense',
    locations=['xcit_dense.hooks', 'xcit_dense.precision'])
MODELS = Registry(
    'model', parent=MMENGINE_MODELS, scope='xcit_dense',
    locations=['xcit_dense.models'])
OPTIM_WRAPPER_CONSTRUCTORS = Registry(
    'optimizer wrapper constructor',
    parent=MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS, scope='xcit_dense',
    locations=['xcit_dense.optim'])
TASK_UTILS = Registry(
    'task util', parent=MMENGINE_TASK_UTILS, scope='xcit_dense',
    locations=['xcit_dense.matching'])
TRANSFORMS = Registry(
    'transform', parent=MMENGINE_TRANSFORMS, scope='xcit_dense',
    locations=['xcit_dense.transforms'])
