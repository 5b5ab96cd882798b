"""Which computation each part runs for an input, and why.

Every part with a fast path decides per call, in one method (``_decide``),
between its fast path and its straightforward computation, and returns a
:class:`Decision`: the path and the reason, one of :data:`REASONS`. Its
``forward`` takes the path of that decision; :func:`explain_paths` runs a
model once and lists, per part, the decision its call took.
"""
import copy
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Union

import torch
import torch.nn as nn

# Why a part takes its fast path
POLICY_ON, FORCED = 'policy', "'always'"
# Why it runs its straightforward computation instead
SWITCHED_OFF, POLICY_OFF = 'switched off', 'policy off'
TRACED, TRANSFORMED = 'traced', 'autograd transform'
TYPE_REPLACED, LAYER_SETTINGS, HOOK = 'type replaced', 'layer settings', 'hook'
DROPOUT_LIVE, TOO_FEW_TOKENS, DTYPE = 'dropout live', 'too few tokens', 'dtype'
KERNEL_UNAVAILABLE = 'kernel unavailable'
COMPILING, CAPTURING = 'compiling', 'capturing'

#: every reason, and what it means
REASONS: Dict[str, str] = {
    POLICY_ON: "the measured policy lists the part for the input's device "
               'and mode (models/policy.py, POLICY)',
    FORCED: "the setting 'always': every fast path that can run",
    SWITCHED_OFF: 'fast_path=False: the model\'s, the part\'s '
                  'use_fast_path, or xcit_dense.fast_path(False)',
    POLICY_OFF: "the policy does not list the part for the input's device "
                'and mode (eager or compiled): not measured faster there',
    TRACED: 'a torch.jit trace records the straightforward computation '
            '(FLOP counters, the TorchScript-based ONNX export)',
    TRANSFORMED: 'a torch.func transform, or gradients enabled inside '
                 'torch.inference_mode()',
    TYPE_REPLACED: 'the part, or a layer its fast path computes itself, is '
                   'not exactly what that fast path was written for (a '
                   'subclass, a wrapper, a replacement, layers added or '
                   'removed)',
    LAYER_SETTINGS: 'a layer setting the fast path does not compute '
                    '(padding mode, dilation, kernel size, tanh GELU, a '
                    'layer scale that is not one value per channel)',
    HOOK: 'a hook, or a forward set on the instance, on a module below '
          'the part, or a global module hook: those calls run as customised',
    DROPOUT_LIVE: 'dropout that acts (training, rate above 0), which the '
                  'kernels do not apply',
    TOO_FEW_TOKENS: 'too few tokens per channel for the fast path to pay '
                    "(XCA's second moments), or one value per channel to "
                    'normalise in training (LPI)',
    DTYPE: 'a dtype the kernels are not written for (they take fp32, fp16 '
           'and bf16)',
    KERNEL_UNAVAILABLE: 'no Triton, or the kernels failed to compile or run '
                        'on this device (a warning said so once)',
    COMPILING: 'under torch.compile the encoding is computed in the graph',
    CAPTURING: 'while a CUDA graph captures, the encoding is computed in '
               'the graph',
}

STRAIGHTFORWARD = 'straightforward'


class Decision(NamedTuple):
    """The computation a part runs for one call: ``path``, the name of its
    fast path (None: the straightforward computation), and ``reason``."""
    path: Optional[str]
    reason: str


#: the decisions of the call being explained, by part (None: no call is)
_notes: Optional[Dict[nn.Module, Decision]] = None


def note(part: nn.Module, decision: Decision) -> Optional[str]:
    """``decision``'s path, the decision kept while :func:`recording`."""
    if _notes is not None:
        _notes[part] = decision
    return decision.path


@contextmanager
def recording() -> Iterator[Dict[nn.Module, Decision]]:
    """The decisions the parts take inside the block, the last for each
    part (a part that decides again later in a call, as XCA does on its
    kernels' route once its ``qkv`` layer has run, is noted again). One
    block at a time in a process."""
    global _notes
    previous, _notes = _notes, {}
    try:
        yield _notes
    finally:
        _notes = previous


@dataclass(frozen=True)
class PartPath:
    """One part's row of :func:`explain_paths`."""
    name: str  # as ``model.named_modules()`` names it
    part: str  # its class
    path: str  # 'straightforward', the fast path's name, or 'not called'
    reason: str  # a key of REASONS ('' where it was not called)


def explain_paths(model: nn.Module, inputs: Union[torch.Tensor, Sequence[int]],
                  device: Union[str, torch.device, None] = None,
                  autocast: Optional[torch.dtype] = None,
                  training: bool = False) -> List[PartPath]:
    """Run ``model`` (an :class:`~xcit_dense.XCiT`, or a detector or
    segmentor: its ``backbone``) once on ``inputs`` and say, for each part
    with a fast path, which computation it ran and why.

    ``inputs``: a batch of images, or their size ``(H, W)`` (one image of
    the stem's channels) or shape ``(B, C, H, W)``. ``device``: where to
    run (default: the input's, else the model's; a model elsewhere is
    copied there). ``autocast``: the dtype of ``torch.autocast`` around
    the call (None: off). ``training``: training mode with gradients
    recorded (the BatchNorm statistics are restored after), else eval mode
    without. The call runs eagerly (``torch.compile`` set aside, whose
    graph the parts decide in with its compiled column of the policy)."""
    x = _images(_backbone(model), inputs, device)
    if next(model.parameters()).device != x.device:
        model = copy.deepcopy(model).to(x.device)
    net = _backbone(model)
    with _restored(model), recording() as notes:
        net.train(training)
        with torch.set_grad_enabled(training), \
                torch.autocast(x.device.type, dtype=autocast,
                               enabled=autocast is not None), \
                torch.compiler.set_stance('force_eager'):
            net(x)
    rows = []
    for name, m in model.named_modules():
        if hasattr(m, 'use_fast_path'):
            decision = notes.get(m)
            path, reason = ('not called', '') if decision is None else (
                decision.path or STRAIGHTFORWARD, decision.reason)
            rows.append(PartPath(name, type(m).__name__, path, reason))
    return rows


def _backbone(model: nn.Module) -> nn.Module:
    """A detector's or segmentor's ``backbone``, else ``model``."""
    net = getattr(model, 'backbone', None)
    return net if isinstance(net, nn.Module) else model


@contextmanager
def _restored(model: nn.Module) -> Iterator[None]:
    """``model``'s modules' training modes and its buffers (BatchNorm's
    statistics) as they were before the block."""
    modes = {m: m.training for m in model.modules()}
    buffers = [(b, b.clone()) for b in model.buffers()]
    try:
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode
        with torch.no_grad():
            for b, kept in buffers:
                b.copy_(kept)


def _images(net: nn.Module, inputs: Union[torch.Tensor, Sequence[int]],
            device: Union[str, torch.device, None]) -> torch.Tensor:
    """``inputs`` as a batch of images on ``device``."""
    if isinstance(inputs, torch.Tensor):
        return inputs if device is None else inputs.to(device)
    shape = tuple(inputs)
    if len(shape) == 2:
        shape = (1, getattr(net, 'in_channels', 3), *shape)
    if len(shape) != 4 or not all(isinstance(s, int) and s > 0
                                  for s in shape):
        raise ValueError(f'inputs must be a batch of images, (H, W) or '
                         f'(B, C, H, W) with positive sizes; got {inputs!r}')
    if device is None:
        device = next(net.parameters()).device
    return torch.randn(shape, generator=torch.Generator().manual_seed(0)
                       ).to(device)
