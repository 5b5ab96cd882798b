"""Whether a module is what a fast path computes itself: the plain PyTorch
layer it was written for, an identity (inactive dropout), and a call that
no hook or instance-level ``forward`` customises."""
from typing import Optional

import torch.nn as nn
from mmengine.model.utils import _BatchNormXd
from timm.layers import DropPath
from torch.utils.module_tracker import ModuleTracker

from .paths import LAYER_SETTINGS, TYPE_REPLACED


def is_inactive(module: nn.Module) -> bool:
    """``module`` is an identity now: ``nn.Identity``, or an ``nn.Dropout``
    / timm ``DropPath`` that is in eval mode or has rate 0. Anything else
    (another class, live dropout) may act and is called."""
    if type(module) is nn.Identity:
        return True
    if type(module) is nn.Dropout:
        return not module.training or module.p == 0
    if type(module) is DropPath:
        return not module.training or module.drop_prob == 0
    return False


def is_exact_gelu(module: nn.Module) -> bool:
    """``module`` is ``nn.GELU()`` with the exact (erf) formula, which the
    fused kernels compute."""
    return type(module) is nn.GELU and module.approximate == 'none'


#: PyTorch's tables of the hooks registered for every module's call
#: (``nn.modules.module.register_module_forward_hook`` and the like; the
#: same dicts for the whole process)
_GLOBAL_HOOKS = (nn.modules.module._global_forward_hooks,
                 nn.modules.module._global_forward_pre_hooks,
                 nn.modules.module._global_backward_hooks,
                 nn.modules.module._global_backward_pre_hooks)


def global_hooks() -> bool:
    """Hooks registered for every module's call, forward or backward,
    other than those of PyTorch's ``ModuleTracker``, which note which
    module runs (``torch.utils.flop_counter.FlopCounterMode`` attributes
    its counts with them; a fast path's operators count for the module
    whose fast path runs them)."""
    return any(_GLOBAL_HOOKS) and any(
        not isinstance(getattr(hook, '__self__', None), ModuleTracker)
        for table in _GLOBAL_HOOKS for hook in table.values())


def _customised_call(d: dict) -> bool:
    """The module whose ``__dict__`` is ``d`` has hooks of its own, forward
    or backward, or a ``forward`` set on the instance."""
    return bool(d['_forward_hooks'] or d['_forward_pre_hooks'] or
                d['_backward_hooks'] or d['_backward_pre_hooks'] or
                'forward' in d)


def _customised(module: nn.Module) -> bool:
    """``module``'s call is customised: its own hooks or ``forward``
    (:func:`_customised_call`), or global hooks."""
    return _customised_call(module.__dict__) or global_hooks()


def customised_below(module: nn.Module) -> bool:
    """The call of a module below ``module`` is customised (``module``'s
    own call runs as customised): it has hooks, forward or backward, its
    own or global (a feature extractor's, Grad-CAM's, a FLOP counter's,
    ``weight_norm``'s pre-hook that recomputes the weight), or a
    ``forward`` set on the instance (mmengine's ``activation_checkpointing``
    and ``efficient_conv_bn_eval`` set one, as may a researcher). A fast
    path computes its children's calls itself, so it runs only where none
    is customised; else the module runs its straightforward computation,
    which calls each child. Below a child that is a part with a fast path
    of its own (``use_fast_path``) that part decides, as it does when it is
    called."""
    return global_hooks() or _customised_children(module)


def _customised_children(module: nn.Module) -> bool:
    """:func:`customised_below` without the global hooks (this runs on
    every call of a part: the modules' ``__dict__`` read directly)."""
    for child in module._modules.values():
        if child is None:
            continue
        d = child.__dict__
        if _customised_call(d):
            return True
        if d['_modules'] and \
                getattr(type(child), 'use_fast_path', None) is None and \
                _customised_children(child):
            return True
    return False


def is_plain_linear(layer: nn.Module) -> bool:
    """Exactly an ``nn.Linear`` whose call is not customised (hooks, an
    instance-level ``forward``): ``F.linear`` of its weights computes it."""
    return type(layer) is nn.Linear and not _customised(layer)


def is_plain_layer_norm(norm: nn.Module, channels: int) -> bool:
    """Exactly an ``nn.LayerNorm`` over the last dimension of ``channels``,
    with weight and bias, whose call is not customised (hooks, an
    instance-level ``forward``): ``F.layer_norm`` of its parameters
    computes it."""
    return type(norm) is nn.LayerNorm and \
        tuple(norm.normalized_shape) == (channels,) and \
        norm.weight is not None and norm.bias is not None and \
        not _customised(norm)


#: The BatchNorms the fast paths compute from their parameters and
#: statistics (folded into the convolution before them in eval mode, or in
#: LPI's kernels): ``nn.BatchNorm2d``, ``nn.SyncBatchNorm`` and mmengine's
#: ``_BatchNormXd``, which mmengine's runner (not distributed) and
#: ``revert_sync_batchnorm`` put in place of SyncBN: ``_BatchNorm``'s
#: forward without the check of the input's dimensions. A subclass runs its
#: own ``forward``.
BATCH_NORMS = (nn.BatchNorm2d, nn.SyncBatchNorm, _BatchNormXd)


def is_plain_batch_norm(norm: nn.Module) -> bool:
    """Exactly one of :data:`BATCH_NORMS` whose call is not customised
    (hooks, an instance-level ``forward``)."""
    return type(norm) in BATCH_NORMS and not _customised(norm)


def is_plain_conv(conv: nn.Module) -> bool:
    """An ``nn.Conv2d`` / ``nn.ConvTranspose2d`` with zero padding and no
    dilation (what the fast kernels compute)."""
    return conv_refusal(conv) is None


def conv_refusal(conv: nn.Module) -> Optional[str]:
    """Why ``conv`` is not what :func:`is_plain_conv` asks (a reason of
    :mod:`.paths`), or None."""
    if type(conv) not in (nn.Conv2d, nn.ConvTranspose2d):
        return TYPE_REPLACED
    if conv.padding_mode != 'zeros' or isinstance(conv.padding, str) or \
            any(d != 1 for d in conv.dilation):
        return LAYER_SETTINGS
    return None
