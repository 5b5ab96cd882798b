"""The backbone's forward compiled by ``torch.compile`` (``compile_cfg``),
and its fallback: if compiling or the compiled forward fails, one warning
and the eager forward from then on (:func:`run_compiled`)."""
import logging
from contextlib import nullcontext
from functools import partial
from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmengine.logging import print_log

from ...errors import first_line
from .. import policy


def compile_options(model: nn.Module, device_type: str) -> Optional[dict]:
    """The ``torch.compile`` arguments of ``model``'s forward on
    ``device_type``, or ``None`` (eager): ``compile_cfg``, with ``'auto'``
    resolved by the policy; ``None`` once compiling has failed (its error
    is kept in ``compile_failure``)."""
    if model.compile_failure is not None:
        return None
    if model.compile_cfg == 'auto':
        return policy.compile_options(device_type)
    return model.compile_cfg


def run_compiled(model: nn.Module, options: dict,
                 x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """``model._forward_pyramid(x)`` compiled with ``options`` (on the
    first call; kept in the model's ``__dict__``), or, if compiling or the
    compiled forward fails, eagerly with one warning and ``compile_failure``
    set: the model runs eagerly from then on."""
    try:
        compiled = model.__dict__.get('_compiled_forward')
        if compiled is None:  # compiled lazily, on the first call
            compiled = torch.compile(type(model)._forward_pyramid,
                                     **inductor_fixes(options))
            model.__dict__['_compiled_forward'] = compiled
        with _backward_compiled_with_forward():
            outs = compiled(model, x)
    except Exception as error:  # the compiler's failure, or the model's
        failure = first_line(error)
    else:
        if torch.is_grad_enabled() and options.get('backend') != 'eager':
            for out in outs:  # before the compiled backward runs
                if out.grad_fn is not None:
                    out.grad_fn.register_prehook(
                        partial(_compiled_backward_not_recorded, model))
        return outs
    # the eager forward decides: if it fails too, its error is the
    # model's own and is raised alone; if it runs, compiling stops here
    outs = model._forward_pyramid(x)
    model.compile_failure = failure
    print_log(
        f'XCiT: torch.compile of the backbone failed ({failure}); the '
        f'backbone runs eagerly from now on. Set '
        f'model.backbone.compile_cfg=None to skip compiling.',
        logger='current', level=logging.WARNING)
    return outs


def _compiled_backward_not_recorded(model: nn.Module, grad_outputs) -> None:
    """Before a compiled forward's backward: if that backward is
    recorded (``create_graph=True``: second derivatives, which
    AOTAutograd's compiled backward does not give), compiling stops
    and this step with a message."""
    if not torch.is_grad_enabled():
        return
    model.compile_failure = ('a backward through it was recorded '
                             '(create_graph=True)')
    raise RuntimeError(
        'XCiT: this step ran the compiled backbone, whose backward '
        "(AOTAutograd's) cannot be differentiated again "
        '(create_graph=True: a gradient penalty). The backbone runs '
        'eagerly from the next step on, where second derivatives are '
        'exact; to have them from the start, set '
        'model.backbone.compile_cfg=None.')


def inductor_fixes(options: dict) -> dict:
    """``options`` for ``torch.compile``, less what is known to fail:
    Inductor's memory-coalescing analysis of tiled kernels (PyTorch 2.11,
    ``tiling_utils.get_pw_red_splits``) asserts on the backbone's training
    graph with dynamic shapes (on the H200; its config notes that it
    does not apply to dynamic shapes yet), so it is off where shapes may
    become dynamic (``dynamic`` not ``False``). Only for Inductor and where
    no ``mode`` or ``options`` were given, which ``torch.compile`` takes one
    at a time."""
    if options.get('dynamic') is False or 'mode' in options or \
            'options' in options or \
            options.get('backend', 'inductor') != 'inductor':
        return options
    return dict(options,
                options={'triton.coalesce_tiling_analysis': False})


def _backward_compiled_with_forward():
    """AOTAutograd compiles a graph's backward on its first use, inside
    ``loss.backward()``, where a compiler failure could only end the run;
    compiled with the forward instead, it fails where the backbone falls
    back (a no-op on a PyTorch without the switch)."""
    config = torch._functorch.config
    if not hasattr(config, 'force_non_lazy_backward_lowering'):
        return nullcontext()
    return config.patch(force_non_lazy_backward_lowering=True)
