"""When a module takes its fast computation instead of the straightforward
one: the switches and the measured policy, in one place.

Every module of the backbone that has a fast path (stem, positional encoding,
XCA, LPI, MLP, block, pyramid up-sampler) keeps its straightforward
computation beside it in the same ``forward`` and takes the fast one only
when :func:`decide` lets it (and says why, :mod:`.paths`):

1. the switches allow it, globally and for that module (:mod:`.switches`),
   and the call is not in a ``torch.jit`` trace (a trace, as the FLOP
   counters take, records the straightforward computation);
2. the module is exactly the class the fast path was written for (a
   subclass, a wrapper or a replacement runs its own ``forward``);
3. with the default setting ``True``, :data:`POLICY` says the fast path pays
   for that part on the input's device, eagerly or under ``torch.compile``;

and the module then checks its own parts and state (exact child types,
dropout that is really inactive, ...) before it uses them, and, where a
fast path pays only for large enough inputs, the input's size (XCA's
second moments, :func:`.ops.second_moments.pays`; the MLP's and LPI's
oneDNN calls on the CPU, :func:`.ops.onednn.pays`; not under
``'always'``).

The switches are in :mod:`.switches`, the checks of a module's layers and
calls in :mod:`.plain_modules`.
"""
from typing import Dict, FrozenSet, Optional

import torch
import torch.nn as nn

from .paths import (
    FORCED,
    HOOK,
    POLICY_OFF,
    POLICY_ON,
    SWITCHED_OFF,
    TRACED,
    TRANSFORMED,
    TYPE_REPLACED,
    Decision,
)
from .plain_modules import (  # noqa: F401 (the parts ask them here)
    BATCH_NORMS,
    conv_refusal,
    customised_below,
    global_hooks,
    is_exact_gelu,
    is_inactive,
    is_plain_batch_norm,
    is_plain_conv,
    is_plain_layer_norm,
    is_plain_linear,
)
from .switches import (  # noqa: F401 (the parts ask them here)
    SWITCHES,
    Setting,
    Switches,
    check_setting,
    combined,
    fast_path,
    set_fast_path,
)

EAGER, COMPILED = 'eager', 'compiled'
_BOTH = frozenset({EAGER, COMPILED})

#: Where each part's fast path runs with the default setting ``True``: per
#: device type, the modes (``'eager'``, ``'compiled'``: under
#: ``torch.compile``) in which it was measured faster than the straightforward
#: computation. A device type not listed runs the straightforward
#: computation (nothing was measured there). On CUDA, eagerly, XCA and LPI
#: take their Triton kernels (``ops/xca_kernels.py``, ``ops/lpi_kernels.py``),
#: and the pyramid's up-sampler runs its straightforward computation: its
#: token GEMMs and pixel shuffle, written for the CPU, launch more kernels
#: than ``nn.ConvTranspose2d`` (tests/test_launches.py counts them), where
#: an eager forward is bound by kernel launches; under ``torch.compile``
#: Inductor fuses the fast paths' small kernels. The measurements:
#: docs/performance.md, "Where the fast paths run".
POLICY: Dict[str, Dict[str, FrozenSet[str]]] = {
    'ConvPatchEmbed': dict(cpu=_BOTH, cuda=_BOTH),
    'CachedFourierEncoding': dict(cpu=_BOTH, cuda=_BOTH),
    'XCA': dict(cpu=_BOTH, cuda=_BOTH),
    'LPI': dict(cpu=_BOTH, cuda=_BOTH),
    'Mlp': dict(cpu=_BOTH, cuda=_BOTH),
    'XCABlock': dict(cpu=_BOTH, cuda=_BOTH),
    'TransposedConvUpsampler': dict(cpu=_BOTH, cuda=frozenset({COMPILED})),
}

#: Where the Triton kernels of XCA and LPI (``ops/xca_kernels.py``,
#: ``ops/lpi_kernels.py``) run, eagerly: Triton compiles for CUDA (the tests
#: add the CPU, with Triton's interpreter); and the dtypes they are written
#: for (they accumulate in fp32).
KERNEL_DEVICES = ('cuda',)
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def kernel_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype in which a layer takes ``x``: autocast's where it is on for
    ``x``'s device and ``x`` is not fp64 (as autocast casts a convolution's
    or a linear layer's input), else ``x``'s."""
    if torch.is_autocast_enabled(x.device.type) and x.dtype != torch.float64:
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def on_kernel_device(x: torch.Tensor) -> bool:
    """``x`` is on one of :data:`KERNEL_DEVICES`, outside ``torch.compile``
    (which takes the modules' other fast paths) and where no dispatch mode
    watches the operators (:func:`operators_observed`): where a module's
    Triton kernels are its fast path, for the :data:`KERNEL_DTYPES`."""
    return x.device.type in KERNEL_DEVICES and \
        not torch.compiler.is_compiling() and not operators_observed()


def operators_observed() -> bool:
    """A Python dispatch mode sees the operators that run now (PyTorch's
    ``FlopCounterMode``, a debug or logging ``TorchDispatchMode``), outside
    ``torch.compile``'s tracing. The fast paths then run in PyTorch's
    standard operators, with their own arithmetic (folded weights, XCA's
    second moments), not as oneDNN's custom operators, Triton kernels or
    CUDA graph replays, which such a mode cannot see into (the FLOP counter
    counted them as nothing): what the mode sees is what executes."""
    return not torch.compiler.is_compiling() and \
        torch._C._len_torch_dispatch_stack() > 0


#: ``XCiT(compile_cfg='auto')``: the ``torch.compile`` arguments per device
#: type where compiling was measured faster than eager and passed the tests;
#: a device type not listed runs eagerly. None is listed: on the CPU a
#: compile takes minutes and the eager fast paths are the measured
#: baseline; on CUDA the compiled inference was slower than eager and
#: Inductor failed on the Mask R-CNN recipe's training graph
#: (docs/performance.md, "GPU"). Compilation stays available, opt-in:
#: ``compile_cfg=True`` or a dict of arguments.
COMPILE: Dict[str, dict] = {}

#: ``XCiT(cuda_graphs='auto')``: per device type, what is replayed from CUDA
#: graphs (``'infer'``, ``'train'``) where that was measured faster than the
#: eager default and passed the tests (``tests/test_cuda.py`` replays both
#: equal to eager calls); a device type not listed runs eagerly. The
#: measurements: docs/performance.md, "GPU". ``'auto'`` captures only
#: inputs that recur (:mod:`xcit_dense.models.execution.cuda_graphs`).
GRAPHS: Dict[str, FrozenSet[str]] = {'cuda': frozenset({'infer', 'train'})}


def pays(part: str, device_type: str, compiling: bool) -> bool:
    """:data:`POLICY`: the fast path of ``part`` (a class name) was measured
    faster on ``device_type``, eagerly or compiled."""
    modes = POLICY.get(part, {}).get(device_type, frozenset())
    return (COMPILED if compiling else EAGER) in modes


def decide(module: nn.Module, cls: type, x: torch.Tensor,
           path: str) -> Decision:
    """Whether ``path``, the fast path written for ``cls``, may run for
    ``module`` on input ``x``, and why: not in a ``torch.jit`` trace, nor
    under an autograd it is not written for (:func:`plain_autograd`), the
    switches allow it, ``module`` is an instance of exactly ``cls``,
    (setting ``True``) the policy says it pays on ``x``'s device in the
    current mode, and no module below ``module`` is customised
    (:func:`customised_below`: hooks, an instance-level ``forward``). The
    part then checks what its fast path needs of its layers and input.

    A trace records the straightforward computation, whatever the
    switches: the operators and the arithmetic of the published design,
    which the FLOP counters built on traces count (mmengine's
    ``get_model_complexity_info``, and with it mmdet's and mmseg's
    ``get_flops.py``; fvcore); a fast path's oneDNN calls cannot be traced,
    and its choices by input size would be frozen into the trace."""
    if torch.jit.is_tracing():
        return Decision(None, TRACED)
    if not plain_autograd():
        return Decision(None, TRANSFORMED)
    setting = combined(SWITCHES.fast_path, module.use_fast_path)
    if setting is False:
        return Decision(None, SWITCHED_OFF)
    if type(module) is not cls:
        return Decision(None, TYPE_REPLACED)
    if setting != 'always' and not pays(
            cls.__name__, x.device.type, torch.compiler.is_compiling()):
        return Decision(None, POLICY_OFF)
    if customised_below(module):
        return Decision(None, HOOK)
    return Decision(path, FORCED if setting == 'always' else POLICY_ON)


def applies(module: nn.Module, cls: type, x: torch.Tensor) -> bool:
    """:func:`decide` lets the fast path written for ``cls`` run."""
    return decide(module, cls, x, 'fast').path is not None


def plain_autograd() -> bool:
    """Autograd as the fast paths are written for: no ``torch.func``
    transform active (``grad``, ``jacrev``, ``vmap``, ``functional_call``
    under them: the fast paths' autograd functions define no
    ``setup_context`` nor batching rule, and their layouts are chosen for
    plain tensors) and not gradients enabled inside ``inference_mode``
    (where autograd records nothing, while the fast paths read grad mode
    to choose their functions, which cannot save inference tensors). There
    the modules run their straightforward computation, as PyTorch's own
    fast paths (``nn.MultiheadAttention``'s) step aside for what they were
    not written for. Inside ``torch.compile``'s tracing the compiler
    decides (and cannot trace these queries)."""
    if torch.compiler.is_compiling():
        return True
    transformed = getattr(torch._C, '_are_functorch_transforms_active',
                          None)
    if transformed is not None and transformed():
        return False
    return not (torch.is_inference_mode_enabled() and
                torch.is_grad_enabled())


def forced(module: nn.Module) -> bool:
    """The setting for ``module`` is ``'always'``: its fast path runs
    wherever it can, also for inputs for which the module's own measure
    says it does not pay (XCA's second moments for few tokens, the MLP's
    and LPI's oneDNN calls for small inputs)."""
    return combined(SWITCHES.fast_path, module.use_fast_path) == 'always'


def compile_options(device_type: str) -> Optional[dict]:
    """``compile_cfg='auto'``: the ``torch.compile`` arguments for
    ``device_type``, or ``None`` (eager)."""
    options = COMPILE.get(device_type)
    return None if options is None else dict(options)


def graphed(device_type: str) -> FrozenSet[str]:
    """``cuda_graphs='auto'``: what is replayed from CUDA graphs on
    ``device_type`` (``'infer'``, ``'train'``; empty: eager)."""
    return GRAPHS.get(device_type, frozenset())

