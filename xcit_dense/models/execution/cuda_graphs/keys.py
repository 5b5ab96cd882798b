"""What a CUDA graph of the backbone depends on: where a forward may be
captured (:func:`applies`, :func:`applies_to_training`), the input
(:func:`input_key`) and the model (:func:`fingerprint`) that select a
graph, and the objects a graph keeps alive (:func:`held_with_storages`)."""
import operator
from typing import Hashable, List, Tuple

import torch
import torch.nn as nn

from ... import policy

#: device types whose inference is graphed (the tests add the CPU with a
#: stand-in for the capture)
DEVICES = ('cuda',)

Outputs = Tuple[torch.Tensor, ...]


def _capturable(x: torch.Tensor) -> bool:
    """A forward on ``x`` may be captured: a device of :data:`DEVICES`,
    outside ``torch.compile``, ``torch.func`` transforms
    (:func:`~xcit_dense.models.policy.plain_autograd`), dispatch modes
    (:func:`~xcit_dense.models.policy.operators_observed`) and another
    capture."""
    return x.device.type in DEVICES and \
        not torch.compiler.is_compiling() and not torch.jit.is_tracing() \
        and policy.plain_autograd() and not policy.operators_observed() \
        and not (x.is_cuda and torch.cuda.is_current_stream_capturing())


def applies(model: nn.Module, x: torch.Tensor) -> bool:
    """``model(x)`` is inference that may be replayed: eval mode, no
    gradient, and :func:`_capturable`."""
    return not model.training and not torch.is_grad_enabled() and \
        _capturable(x)


def applies_to_training(model: nn.Module, x: torch.Tensor) -> bool:
    """``model(x)`` is a training forward whose step may be replayed:
    training mode, gradients enabled, and :func:`_capturable`."""
    return model.training and torch.is_grad_enabled() and _capturable(x)


#: a module's hooks that its call runs (the ``*_with_kwargs`` and
#: ``always_called`` tables are keyed by these hooks' handles)
_HOOKS = ('_forward_pre_hooks', '_forward_hooks', '_backward_pre_hooks',
          '_backward_hooks')
#: where :func:`fingerprint`'s key holds its parts: the global hook tables
#: first, then one entry per module (the model's first), each with its hook
#: tables at ``_HOOKS_AT``
_GLOBAL_TABLES, _HOOKS_AT = 4, 3
_data_ptr = torch.Tensor.data_ptr
_requires_grad = operator.attrgetter('requires_grad')


def fingerprint(model: nn.Module
                ) -> Tuple[Tuple[Hashable, ...], List[object]]:
    """What ``model``'s forward depends on besides its input: each module's
    identity and class, the identity of every value in its ``__dict__``
    (so an attribute set or edited, ``training`` and a function set on the
    instance among them, changes it), its hooks (forward and backward, and
    the global ones), and each parameter's and buffer's identity and
    storage (a new dtype, device or size is new storage) and whether it
    requires gradients (a training step's graph computes the gradients of
    those that did at its capture). Also the objects whose identities it
    holds: kept alive with a graph, so that no new object can take one of
    their identities."""
    hooks = nn.modules.module
    parts = [tuple(hooks._global_forward_pre_hooks),
             tuple(hooks._global_forward_hooks),
             tuple(hooks._global_backward_pre_hooks),
             tuple(hooks._global_backward_hooks)]
    held = []
    for module in model.modules():
        d = module.__dict__
        values = tuple(d.values())
        tensors = [t for t in (*d['_parameters'].values(),
                               *d['_buffers'].values()) if t is not None]
        held.append((module, values, tensors))
        parts.append((id(module), type(module), tuple(map(id, values)),
                      *(tuple(d[name]) for name in _HOOKS),
                      tuple(map(id, tensors)), tuple(map(_data_ptr, tensors)),
                      tuple(map(_requires_grad, tensors))))
    return tuple(parts), held


def hooked_below(model_key: Tuple[Hashable, ...]) -> bool:
    """A module below the model whose :func:`fingerprint` is
    ``model_key`` has hooks, or global hooks are registered
    (:func:`.policy.global_hooks`): read from the fingerprint (its walk
    over the modules is taken once, while the GPU replays), the modules'
    hook tables after the model's own. A replay would not call them: the
    model then runs eagerly."""
    below = model_key[_GLOBAL_TABLES + 1:]  # after the model's own entry
    return policy.global_hooks() or any(
        any(part[_HOOKS_AT:_HOOKS_AT + len(_HOOKS)]) for part in below)


def input_key(x: torch.Tensor) -> Tuple[Hashable, ...]:
    """What selects a graph besides the model: the input's shape, dtype and
    device, the autocast state of its device, inference mode (whose tensors
    a later call outside it could not write), whether fp32 products may use
    TF32 (cuBLAS's and cuDNN's math mode and the Triton kernels' precision
    are fixed at capture) and the process-wide fast-path switches."""
    device = x.device.type
    autocast = torch.is_autocast_enabled(device) and \
        torch.get_autocast_dtype(device)
    tf32 = (torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32)
    switches = (policy.SWITCHES.fast_path, policy.SWITCHES.fused_kernels,
                policy.SWITCHES.piece_tokens)
    return (tuple(x.shape), x.dtype, str(x.device), autocast,
            torch.is_inference_mode_enabled(), tf32, switches)



def held_with_storages(held: List[object]) -> Tuple[List[object], list]:
    """``held`` (:func:`fingerprint`'s objects of the model as captured)
    with the storages of its parameters and buffers, which a graph reads
    and writes: kept alive with the graph, so that a replay launched after
    the model changed (a ``.data`` set anew, say) never touches freed
    memory."""
    return held, [t.untyped_storage() for *_, tensors in held
                  for t in tensors]
