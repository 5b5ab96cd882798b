"""One forward of the backbone as its settings run it: under the autocast
it asks for, compiled, replayed from CUDA graphs or eagerly
(:func:`run_forward`)."""
from typing import FrozenSet, Tuple

import torch
import torch.nn as nn

from ...precision import requested_autocast
from .. import policy
from ..presets import normalized_compile_cfg
from . import cuda_graphs
from .compile import compile_options, run_compiled
from .cuda_graphs import GraphedInference, GraphedTraining

Outputs = Tuple[torch.Tensor, ...]

#: what an explicit ``cuda_graphs`` replays on the devices graphs run on
GRAPHED = {False: frozenset(), True: frozenset({'infer'}),
           'train': frozenset({'infer', 'train'})}


def init_execution(model: nn.Module, compile_cfg, autocast_dtype,
                   cuda_graphs) -> None:
    """The settings :func:`run_forward` reads, set on ``model`` (the
    ``XCiT`` arguments of these names, checked): ``autocast_dtype``,
    ``compile_cfg`` and ``cuda_graphs``; and what they leave:
    ``compile_failure`` (why compiling stopped, or None), ``graphs`` and
    ``training_graphs`` (the CUDA graphs captured, not copied with the
    model)."""
    model.autocast_dtype = autocast_dtype
    model.compile_cfg = normalized_compile_cfg(compile_cfg)
    model.compile_failure = None
    model.cuda_graphs = cuda_graphs
    model.graphs = GraphedInference()
    model.training_graphs = GraphedTraining()


def run_forward(model: nn.Module, x: torch.Tensor) -> Outputs:
    """``model._forward_pyramid(x)``, the model's computation, as its
    settings run it: under ``autocast_dtype`` (fp32 maps returned) unless
    an autocast is on already; compiled (``compile_cfg``), replayed from
    CUDA graphs (``cuda_graphs``) or eagerly."""
    dtype = model.autocast_dtype
    if dtype is not None and not torch.is_autocast_enabled(x.device.type):
        with requested_autocast(x.device.type, dtype,
                                f'XCiT(autocast_dtype={dtype!r})',
                                'the backbone'):
            outs = _compiled_graphed_or_eager(model, x)
        return tuple(o.float() for o in outs)
    return _compiled_graphed_or_eager(model, x)


def _compiled_graphed_or_eager(model: nn.Module, x: torch.Tensor) -> Outputs:
    options = compile_options(model, x.device.type)
    if options is not None and not torch.compiler.is_compiling() and \
            not torch.jit.is_tracing():
        return run_compiled(model, options, x)
    graphs = graphed(model, x.device.type)
    auto = model.cuda_graphs == 'auto'
    if 'infer' in graphs and cuda_graphs.applies(model, x):
        return model.graphs(model, model._forward_pyramid, x, auto)
    if 'train' in graphs and cuda_graphs.applies_to_training(model, x):
        return model.training_graphs(model, model._forward_pyramid, x, auto)
    return model._forward_pyramid(x)


def graphed(model: nn.Module, device_type: str) -> FrozenSet[str]:
    """What ``model.cuda_graphs`` replays from CUDA graphs on
    ``device_type``: ``'infer'``, ``'train'``, both or neither, with
    ``'auto'`` resolved by the policy (:data:`~..policy.GRAPHS`)."""
    if model.cuda_graphs == 'auto':
        return policy.graphed(device_type)
    return GRAPHED[model.cuda_graphs]
