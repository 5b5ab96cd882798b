"""When a module takes its fast computation instead of the straightforward
one: the switches and the measured policy, in one place.

Every module of the backbone that has a fast path (stem, positional encoding,
XCA, LPI, MLP, block, pyramid up-sampler) keeps its straightforward
computation beside it in the same ``forward`` and takes the fast one only
when :func:`applies` says so:

1. the switches allow it, globally and for that module (see below), and
   the call is not in a ``torch.jit`` trace (a trace, as the FLOP counters
   take, records the straightforward computation);
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

Switch values: ``True`` (default) where :data:`POLICY` says it pays;
``'always'`` wherever it can run, whatever the device (for tests and
measurements); ``False`` never (the straightforward computation
everywhere). Set them with

* ``XCiT(fast_path=...)`` (a config key) or ``model.set_fast_path(...)`` for
  one model; each module's ``use_fast_path`` attribute for one module;
* :func:`set_fast_path` globally, or ``with fast_path(...):`` for a block of
  code (tests, ``tools/benchmark.py``'s ``@reference`` rows): one API for
  the three process-wide :class:`Switches` (the fast paths, the CPU's
  fused oneDNN kernels, the token pieces of CPU inference).

``False`` wins over ``'always'``, which wins over ``True``.
"""
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Dict, FrozenSet, Iterator, Optional, Union

import torch
import torch.nn as nn
from mmengine.model.utils import _BatchNormXd
from timm.layers import DropPath
from torch.utils.module_tracker import ModuleTracker

Setting = Union[bool, str]

EAGER, COMPILED = 'eager', 'compiled'
_BOTH = frozenset({EAGER, COMPILED})

#: Where each part's fast path runs with the default setting ``True``: per
#: device type, the modes (``'eager'``, ``'compiled'``: under
#: ``torch.compile``) in which it was measured faster than the straightforward
#: computation. A device type not listed runs the straightforward
#: computation (nothing was measured there). The measurements:
#: docs/performance.md, "Where the fast paths run" (CPU:
#: ``tools/benchmark.py``; CUDA: ``docs/benchmark/gpu/policy_probe.py`` and
#: ``make gpu-report``).
#:
#: CUDA, eager: every fast path, XCA's and LPI's on their Triton kernels
#: (``ops/xca_kernels.py``, ``ops/lpi_kernels.py``). XCiT-S12/16 at
#: 800x1344 on an H200 (PyTorch 2.11, ``tools/benchmark.py --device cuda``,
#: one process per row, medians of 20): the training step under fp16
#: autocast, batch 2, 39.6 ms against 55.9 ms for the straightforward
#: computation (1.41x; 35.8 against 45.4 ms, 1.27x, the next day);
#: inference, batch 1, 10.3 against 10.6 ms in fp32 and 11.3 against
#: 11.9 ms under autocast (equal within the runs' spread:
#: the eager forward is bound by kernel launches). An earlier H100 session,
#: before the Triton kernels, had measured the eager CPU-tuned paths slower
#: (29.4 against 16.2 ms). Under ``torch.compile`` (opt-in on CUDA, see
#: :data:`COMPILE`) Inductor fuses the fast paths' small kernels. Except the
#: pyramid's up-sampler, eagerly: its token GEMM and pixel shuffle, written
#: for the CPU, launch more kernels than ``nn.ConvTranspose2d`` (a tiny
#: XCiT-N12 on CUDA's path, counted on the CPU by tests/test_launches.py:
#: 26 against 20 outside the blocks in fp32 inference, 44 against 40 under
#: fp16 autocast, and 379 against 357 for a whole fp16 training step). The
#: H200's policy probe timed it on and off eagerly (2026-11-26): within the
#: spread of its CPU-paced rows.
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
#: a device type not listed runs eagerly. None is listed today. CPU: a
#: compile takes minutes on a small CPU, and the eager fast paths are the
#: measured CPU baseline. CUDA (H100, PyTorch 2.11, XCiT-S12/16 at
#: 800x1344): with dynamic shapes the compiled inference took 14.6 ms
#: against 12.7 ms eager, and Inductor failed to compile the training graph
#: of the Mask R-CNN recipe (docs/performance.md, "GPU"). Compilation stays
#: available, opt-in: ``compile_cfg=True`` or a dict of arguments.
COMPILE: Dict[str, dict] = {}

#: ``XCiT(cuda_graphs='auto')``: per device type, what is replayed from CUDA
#: graphs (``'infer'``, ``'train'``) where that was measured faster than the
#: eager default and passed the tests; a device type not listed runs
#: eagerly. CUDA (H200, PyTorch 2.11, XCiT-S12/16 at 800x1344, default fast
#: paths, fp16 autocast): inference, batch 1, 3.7 ms replayed, where the
#: straightforward computation took 12.4 ms eagerly in the same run (the
#: default eager path 12.9 ms in the session before); a training step,
#: batch 2, 26.5 ms replayed against 75.6 (eager default before: 54.9);
#: ``tests/test_cuda.py`` replays both equal to eager calls
#: (docs/performance.md, "GPU"). ``'auto'`` captures only inputs that
#: recur (:mod:`xcit_dense.models.cuda_graphs`).
GRAPHS: Dict[str, FrozenSet[str]] = {'cuda': frozenset({'infer', 'train'})}


@dataclass
class Switches:
    """The process-wide switches, read on every call (set them with
    :func:`set_fast_path` or ``with fast_path(...):``).

    Attributes:
        fast_path: ``True`` (default), ``'always'`` or ``False`` for every
            model (combined with each model's and module's own setting).
        fused_kernels: the CPU fast paths' oneDNN GEMMs and convolutions
            with fused epilogues (``ops/onednn.py``); ``False``: the
            standard PyTorch operators in the same fast paths.
        piece_tokens: tokens per piece of CPU inference (``ops/pieces.py``);
            ``None`` (default): sized by memory; a number: exactly that
            many (tests of ragged pieces).
    """
    fast_path: Setting = True
    fused_kernels: bool = True
    piece_tokens: Optional[int] = None


SWITCHES = Switches()
_KEEP = object()  # a switch not given: left as it is


def check_setting(enabled: Setting) -> Setting:
    """``enabled`` if it is a valid switch value; one paragraph otherwise."""
    if not (isinstance(enabled, bool) or enabled == 'always'):
        raise ValueError(
            f'fast_path must be True (where the measured policy says it '
            f"pays), 'always' (wherever it can run) or False (never), got "
            f'{enabled!r}')
    return enabled


def set_fast_path(enabled: Setting = _KEEP, *, fused_kernels: bool = _KEEP,
                  piece_tokens: Optional[int] = _KEEP) -> None:
    """Set the process-wide :class:`Switches` (those not given stay as they
    are): ``set_fast_path(False)``, ``set_fast_path(fused_kernels=False)``,
    ``set_fast_path(piece_tokens=7)``."""
    if enabled is not _KEEP:
        SWITCHES.fast_path = check_setting(enabled)
    if fused_kernels is not _KEEP:
        if not isinstance(fused_kernels, bool):
            raise ValueError(f'fused_kernels must be True or False, got '
                             f'{fused_kernels!r}')
        SWITCHES.fused_kernels = fused_kernels
    if piece_tokens is not _KEEP:
        if piece_tokens is not None and not (
                isinstance(piece_tokens, int) and piece_tokens > 0):
            raise ValueError(f'piece_tokens must be None (sized by memory) '
                             f'or a positive int, got {piece_tokens!r}')
        SWITCHES.piece_tokens = piece_tokens


@contextmanager
def fast_path(enabled: Setting = _KEEP, *, fused_kernels: bool = _KEEP,
              piece_tokens: Optional[int] = _KEEP) -> Iterator[None]:
    """:func:`set_fast_path` for a block of code, the previous switches
    restored after: ``with fast_path(False):`` runs every module's
    straightforward computation inside the block (``'always'``: every fast
    path that can run); ``with fast_path(fused_kernels=False):`` the fast
    paths with standard operators."""
    previous = replace(SWITCHES)
    set_fast_path(enabled, fused_kernels=fused_kernels,
                  piece_tokens=piece_tokens)
    try:
        yield
    finally:
        set_fast_path(previous.fast_path,
                      fused_kernels=previous.fused_kernels,
                      piece_tokens=previous.piece_tokens)


def combined(*settings: Setting) -> Setting:
    """One setting from several (global, model, module): ``False`` wins over
    ``'always'``, which wins over ``True``."""
    if any(s is False for s in settings):
        return False
    return 'always' if 'always' in settings else True


def pays(part: str, device_type: str, compiling: bool) -> bool:
    """:data:`POLICY`: the fast path of ``part`` (a class name) was measured
    faster on ``device_type``, eagerly or compiled."""
    modes = POLICY.get(part, {}).get(device_type, frozenset())
    return (COMPILED if compiling else EAGER) in modes


def applies(module: nn.Module, cls: type, x: torch.Tensor) -> bool:
    """The fast path written for ``cls`` may run for ``module`` on input
    ``x``: not in a ``torch.jit`` trace, the switches allow it, ``module``
    is an instance of exactly ``cls``, (setting ``True``) the policy says
    it pays on ``x``'s device in the current mode, and no module below
    ``module`` is customised (:func:`customised_below`: hooks, an
    instance-level ``forward``).

    A trace records the straightforward computation, whatever the
    switches: the operators and the arithmetic of the published design,
    which the FLOP counters built on traces count (mmengine's
    ``get_model_complexity_info``, and with it mmdet's and mmseg's
    ``get_flops.py``; fvcore); a fast path's oneDNN calls cannot be traced,
    and its choices by input size would be frozen into the trace."""
    if torch.jit.is_tracing() or not plain_autograd():
        return False
    setting = combined(SWITCHES.fast_path, module.use_fast_path)
    if setting is False or type(module) is not cls:
        return False
    return (setting == 'always' or pays(
        cls.__name__, x.device.type, torch.compiler.is_compiling())) and \
        not customised_below(module)


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
    return type(conv) in (nn.Conv2d, nn.ConvTranspose2d) and \
        conv.padding_mode == 'zeros' and \
        not isinstance(conv.padding, str) and \
        all(d == 1 for d in conv.dilation)
