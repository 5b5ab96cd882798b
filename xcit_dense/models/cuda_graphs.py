"""Inference replayed from CUDA graphs (``XCiT(cuda_graphs=True)``).

On a GPU the eager backbone is bound by kernel launches: hundreds of small
kernels, each launched from Python. A CUDA graph captures one forward's
kernels and replays them with one launch. The backbone's forward is captured
once per input (:func:`input_key`: shape, dtype, device, autocast state,
inference mode, fast-path switches) and replayed while nothing it depends on
changes; the model is looked at on every call (:func:`fingerprint`: every
module's identity, class, attributes (their identities), hooks (forward and
backward), every parameter's and buffer's identity and storage, and which
parameters require gradients), so a module replaced, wrapped or edited, a
parameter given new storage, or one frozen or unfrozen, is captured anew.
A model with hooks below it (forward or backward, a module's or global)
runs eagerly: a replay would not call them (once a look has found them, the
model is looked at before a replay is launched, until they are gone).
That look takes the CPU a millisecond or two for XCiT-S12, so it is taken
while the GPU replays the graph last used for the input: if the model
changed since that graph's capture, its outputs are dropped (it reads only
memory it holds) and the graph of the model as it is now is replayed.
In-place updates of parameters and buffers (an optimizer step,
``load_state_dict``) are read by the replay itself. Inference: eval mode,
no gradient, not under ``torch.compile`` (whose ``mode='reduce-overhead'``
graphs its own). Captured in CUDA's thread-local mode: other threads' CUDA
calls (a data loader's pinning thread allocating page-locked memory)
neither break the capture nor fail, as under the default global mode.

Training steps (``XCiT(cuda_graphs='train')``, :class:`GraphedTraining`):
the forward and its backward of an input seen :data:`MIN_REPEATS` times
with the model unchanged since the step before (fixed-size crops, a padded
size that recurs; the rare sizes of multi-scale training run eagerly; the
graphs of the inputs that come most kept, as under ``'auto'`` below) are
captured with ``torch.cuda.make_graphed_callables`` on new leaf tensors
over the parameters' memory (:func:`on_leaves_of_its_own`: the parameters'
own gradient accumulators may be held on the default stream, which a capture
cannot make wait) and replayed as one autograd node whose gradients reach
the parameters as an eager backward's do (DistributedDataParallel's hooks
included), as copies: ``make_graphed_callables`` hands out its graph's
own gradient buffers, which autograd would make the parameters' ``.grad``
and the next replay would overwrite (gradients accumulated over steps, or
into a ``.grad`` zeroed in place, would come out wrong). As in inference, the
graph last replayed for an input is launched before the model is looked
at; if the model changed, that replay is dropped and the BatchNorm
statistics it updated are restored. Where ``make_graphed_callables``
captures only in the global mode (no ``capture_error_mode``: PyTorch 2.11
and 2.12), no step is captured while a data loader pins memory
(:func:`not_graphable`).

``XCiT(cuda_graphs='auto')`` (the recipes') replays what the policy lists
for the device (:data:`xcit_dense.models.policy.GRAPHS`) and captures only
what recurs (:class:`Recurrence`): an inference input seen
:data:`MIN_REPEATS` times among the last :data:`WINDOW` calls (with
:data:`MAX_GRAPHS` kept, a new input replaces the least used graph only
if it came :data:`ADMISSION` times as often: with more sizes recurring
than graphs kept, the others run eagerly rather than each capture evicting
a graph captured again soon after), a training input :data:`MIN_REPEATS`
times in a row (fixed-size crops; multi-scale detection's changing sizes
run eagerly), one training graph kept, so that its memory is never held beside
eager steps of other sizes for long, and the inference graphs dropped when
the model goes back to training (after a validation); until an input comes
close to that, the model is not looked at (eager calls pay nothing). A
model that cannot be captured (:func:`not_graphable`) runs eagerly with one
INFO line rather than a warning.

A capture that fails (a forward that synchronises with the CPU, say)
leaves the thread on the capture's stream and the device's random number
generator in capture mode (``torch.cuda.graph`` ends the capture before it
leaves the stream, and the generator's epilogue never runs): both are put
back (:func:`_put_back_if_failed`), so that the eager steps after it,
dropout's and DropPath's random draws among them, run as before; the
warning names the error that broke the capture and the line of the model's
code that raised it.
"""
import contextlib
import functools
import inspect
import logging
import operator
import os.path as osp
import threading
import weakref
from collections import OrderedDict, deque
from typing import (
    Callable,
    Deque,
    Dict,
    Hashable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
)

import torch
import torch.nn as nn
from mmengine.logging import print_log

from ..errors import cause_line
from . import policy

#: device types whose inference is graphed (the tests add the CPU with a
#: stand-in for the capture)
DEVICES = ('cuda',)
#: inference graphs kept per model, those of the inputs that come most
#: (each holds its outputs; their activations share one memory pool)
MAX_GRAPHS = 8
#: calls in a row with the model changed at the same input after which the
#: graphs stop
MAX_CHANGES = 3
#: the calls over which inputs are counted (:class:`Recurrence`), and how
#: many times as often as the input of the least used of the graphs kept a
#: new input must have come to replace it; inputs that come about as often
#: as those kept run eagerly rather than each capture evicting a graph that
#: is captured again soon after (a capture costs about three eager calls)
WINDOW = 1024
ADMISSION = 2
#: times an input must have come (the model unchanged since the call
#: before) before it is captured (inference: under ``'auto'``), and the
#: training graphs kept (in one memory pool they share: one step's
#: activations, and each graph's outputs and gradients)
MIN_REPEATS = 3
MAX_TRAINING_GRAPHS = 2
#: training graphs kept under ``cuda_graphs='auto'``
AUTO_TRAINING_GRAPHS = 1
#: ``make_graphed_callables`` can capture in CUDA's thread-local mode (its
#: ``capture_error_mode``: newer PyTorch); else it captures in the global
#: mode, which other threads' CUDA calls break (:func:`not_graphable`)
TRAINING_CAPTURE_THREAD_LOCAL = 'capture_error_mode' in inspect.signature(
    torch.cuda.make_graphed_callables).parameters

Outputs = Tuple[torch.Tensor, ...]

#: PyTorch's own files: a failed capture's warning names the innermost line
#: outside them (:func:`failure`)
_TORCH = osp.dirname(torch.__file__) + osp.sep


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


def copies(tensors: Sequence[Optional[torch.Tensor]]
           ) -> Tuple[Optional[torch.Tensor], ...]:
    """What ``tuple(t.clone() for t in tensors)`` gives (``None`` kept),
    copied together by ``torch._foreach_copy_``: a few launches for the
    hundreds of a model's gradients, where a clone each launches one per
    tensor."""
    given = [t for t in tensors if t is not None]
    fresh = [torch.empty_like(t) for t in given]
    if given:
        torch._foreach_copy_(fresh, given)
    fresh.reverse()
    return tuple(None if t is None else fresh.pop() for t in tensors)


def _copy_all(into: List[torch.Tensor], given: List[torch.Tensor]) -> None:
    """``into[i].copy_(given[i])`` for every ``i`` (BatchNorm's statistics
    and their saved copies), in a few launches."""
    if into:
        with torch.no_grad():
            torch._foreach_copy_(into, given)


def _held_with_storages(held: List[object]) -> Tuple[List[object], list]:
    """``held`` (:func:`fingerprint`'s objects of the model as captured)
    with the storages of its parameters and buffers, which a graph reads
    and writes: kept alive with the graph, so that a replay launched after
    the model changed (a ``.data`` set anew, say) never touches freed
    memory."""
    return held, [t.untyped_storage() for *_, tensors in held
                  for t in tensors]


def _autocast_as_now(device: str) -> torch.autocast:
    """The caller's autocast state on ``device``, its cache of cast
    weights off (it would outlive a capture)."""
    return torch.autocast(
        device, dtype=torch.get_autocast_dtype(device),
        enabled=torch.is_autocast_enabled(device), cache_enabled=False)


class Recurrence:
    """How often inputs (:func:`input_key`) came: whether one has recurred
    enough to be captured (``'auto'``, ``'train'``) and which graphs to keep
    (those of the inputs that come most). :meth:`count` counts each call's
    input (among the last :data:`WINDOW` calls; with ``in_a_row``, a
    different input starts the count anew); the model is worth looking at
    (:func:`fingerprint`) from the call before a capture on
    (:meth:`looks`), and an input is :meth:`ready` once it came
    :data:`MIN_REPEATS` times with the model unchanged since the call
    before (a model that changes on every call is never captured)."""

    def __init__(self, in_a_row: bool) -> None:
        self.in_a_row = in_a_row
        self.counts: Dict[Hashable, int] = {}
        self.models: Dict[Hashable, Hashable] = {}
        self._window: Deque[Hashable] = deque()

    def count(self, inputs: Hashable) -> None:
        if self.in_a_row and inputs not in self.counts:
            self.counts.clear()
            self.models.clear()
        self.counts[inputs] = self.counts.get(inputs, 0) + 1
        if not self.in_a_row:
            self._window.append(inputs)
            if len(self._window) > WINDOW:
                old = self._window.popleft()
                self.counts[old] -= 1
                if not self.counts[old]:
                    del self.counts[old]
                    self.models.pop(old, None)

    def looks(self, inputs: Hashable) -> bool:
        return self.counts.get(inputs, 0) >= MIN_REPEATS - 1

    def ready(self, inputs: Hashable, model_key: Hashable) -> bool:
        last, self.models[inputs] = self.models.get(inputs), model_key
        return self.counts.get(inputs, 0) >= MIN_REPEATS and \
            last == model_key


def failure(what: str, error: BaseException) -> str:
    """Why a capture failed, for the warning: the error that broke it (the
    first of the chain: a capture broken by its forward's error ends with
    "operation failed due to a previous error during capture") and the
    line of the model's code that raised it."""
    return f'{what} failed ({cause_line(error, _TORCH)})'


@contextlib.contextmanager
def _put_back_if_failed(device: torch.device) -> Iterator[None]:
    """If the capture inside fails: the thread's current stream, and the
    state of ``device``'s default random number generator, put back as
    they were before it (the eager steps after a failed capture would
    otherwise run on the capture's stream and stop at their first random
    draw: "Offset increment outside graph capture encountered
    unexpectedly"). The draws of the capture's warm-up iterations are undone
    with them."""
    current = torch.cuda.current_device()
    index = current if device.index is None else device.index
    # the capture's stream is the current device's; x's device's too
    streams = [torch.cuda.current_stream(i) for i in {current, index}]
    generator = torch.cuda.default_generators[index]
    saved = generator.clone_state()
    try:
        yield
    except BaseException:
        for stream in streams:
            torch.cuda.set_stream(stream)  # sets its device current too
        torch.cuda.set_device(current)
        generator.graphsafe_set_state(saved)
        raise


def capture_cuda(forward: Callable[[torch.Tensor], Outputs],
                 x: torch.Tensor, pool) -> Tuple[torch.Tensor, Outputs,
                                                 Callable[[], None], object]:
    """``forward(x)`` captured in a CUDA graph after two warm-up calls on a
    side stream (Triton compiles its kernels, cuDNN picks its algorithms,
    caches fill): the static input, the static outputs, the replay, and
    the memory pool the graph allocated from (shared by a model's
    graphs)."""
    static = x.clone()
    autocast = _autocast_as_now(x.device.type)
    stream = torch.cuda.Stream(device=x.device)
    stream.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(stream), autocast:
        for _ in range(2):
            forward(static)
    torch.cuda.current_stream(x.device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # on the input's GPU, whichever is current (the default capture stream
    # is the current device's)
    # thread-local: another thread's CUDA calls (a data loader's pinning
    # thread allocating page-locked memory) neither break the capture nor
    # fail themselves, as they would under the default global mode
    with torch.cuda.device(x.device), _put_back_if_failed(x.device), \
            torch.cuda.graph(graph, pool=pool, stream=stream,
                             capture_error_mode='thread_local'), autocast:
        outs = forward(static)
    return static, tuple(outs), graph.replay, graph.pool()


class _Graphs:
    """What a model's inference graphs and training graphs share: they stop
    for good with one warning (:meth:`_stop`), and they belong to the model
    object that captured them: a copy of the model (``deepcopy``, pickling)
    starts with none and captures its own."""

    #: what stops, and how to do without it, in the warning
    STOPPED = 'CUDA graphs of the backbone stop: {reason}; it runs eagerly'
    REMEDY = 'model.backbone.cuda_graphs=False to skip them'

    def _stop(self, reason: str, forward: Callable[[torch.Tensor], Outputs],
              x: torch.Tensor, auto: bool = False) -> Outputs:
        """The eager ``forward(x)``, and no graphs from now on, said once:
        a warning with its remedy, or under ``cuda_graphs='auto'`` (which
        the user did not ask for by name) an INFO line. If the eager
        forward fails too, its error is the model's own and is raised
        alone."""
        outs = forward(x)
        self.failure = reason
        self.graphs.clear()
        message = f'XCiT: {self.STOPPED.format(reason=reason)} from now on.'
        print_log(message if auto else f'{message} Set {self.REMEDY}.',
                  logger='current',
                  level=logging.INFO if auto else logging.WARNING)
        return outs

    def _latest_for(self, inputs: Tuple[Hashable, ...]
                    ) -> Optional[Hashable]:
        """The key of the graph last used for ``inputs`` (of whichever
        model), or None: keys are the inputs' and the model's."""
        return next((k for k in reversed(self.graphs) if k[:-1] == inputs),
                    None)

    def _least_used(self, recurrence: Recurrence) -> Hashable:
        """The key of the graph whose input came the fewest times in
        ``recurrence`` (of those, the least recently used)."""
        counts = recurrence.counts
        return min(self.graphs, key=lambda key: counts.get(key[:-1], 0))

    def _admits(self, inputs: Tuple[Hashable, ...], recurrence: Recurrence,
                kept: int) -> bool:
        """A graph may be captured for ``inputs`` (which has none): fewer
        than ``kept`` are kept, or ``inputs`` came :data:`ADMISSION` times
        as often as the input of the least used one, which it replaces."""
        if len(self.graphs) < kept:
            return True
        counts = recurrence.counts
        return counts.get(inputs, 0) >= ADMISSION * counts.get(
            self._least_used(recurrence)[:-1], 0)

    def __deepcopy__(self, memo: Dict) -> '_Graphs':
        return type(self)()

    def __getstate__(self) -> Dict:
        return {}

    def __setstate__(self, state: Dict) -> None:
        self.__init__()


class GraphedInference(_Graphs):
    """A model's captured forwards, one per input (:func:`input_key`) and
    model (:func:`fingerprint`), :data:`MAX_GRAPHS` kept: those of the
    inputs that come most (a new input replaces the least used graph only
    if it came :data:`ADMISSION` times as often). Not copied with the
    model (a copy captures its own). If a capture fails, or the
    model changes between :data:`MAX_CHANGES` calls in a row at the same
    input (a module that sets an attribute in its forward: every call would
    capture), one warning says so and the model runs eagerly from then
    on. One call at a time: a model served from several threads replays
    for one of them after the other (a replay writes its graph's static
    input and outputs, and a capture in CUDA's global mode fails another
    thread's launches)."""

    #: the capture (a stand-in on the CPU in the tests)
    capture = staticmethod(capture_cuda)

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.graphs: 'OrderedDict[Hashable, tuple]' = OrderedDict()
        self.pool = None
        self.failure: Optional[str] = None
        self.captures = 0
        self._last: Optional[tuple] = None  # the last call's key, held
        self._changes = 0  # calls in a row the model changed at one input
        self.recurrence = Recurrence(in_a_row=False)
        self.hooked = False  # the last look found hooks below the model

    def __call__(self, model: nn.Module,
                 forward: Callable[[torch.Tensor], Outputs],
                 x: torch.Tensor, auto: bool = False) -> Outputs:
        """``forward(x)`` (``model``'s forward), replayed from the graph of
        its input and model, captured first if there is none (``auto``:
        once the input has recurred, :class:`Recurrence`; eagerly until
        then); the outputs are the caller's own (copies of the graph's).
        The graph last used for this input is launched before the model is
        looked at (the GPU runs it meanwhile) and its outputs are returned
        only if the model is still the one it was captured from."""
        if self.failure is not None:
            return forward(x)
        with self._lock:
            return self._call(model, forward, x, auto)

    def _call(self, model: nn.Module,
              forward: Callable[[torch.Tensor], Outputs], x: torch.Tensor,
              auto: bool) -> Outputs:
        inputs = input_key(x)
        self.recurrence.count(inputs)  # every call (:meth:`_least_used`)
        # while hooks were found, the model is looked at before a replay
        launched = None if self.hooked else self._latest_for(inputs)
        if launched is not None:
            self._replay(self.graphs[launched], x)
        elif not ((not auto or self.recurrence.looks(inputs)) and
                  self._admits(inputs, self.recurrence, MAX_GRAPHS)):
            return forward(x)
        model_key, held = fingerprint(model)
        self.hooked = hooked_below(model_key)
        if self.hooked:
            return forward(x)  # a launched replay's outputs dropped
        key = (*inputs, model_key)
        # the last call's key, and the objects behind its identities
        last, self._last = self._last, (key, held)
        changed = last is not None and last[0][:-1] == inputs and \
            last[0][-1] != model_key
        self._changes = self._changes + 1 if changed else 0
        if self._changes >= MAX_CHANGES:
            return self._stop(
                f'the model changed between {MAX_CHANGES + 1} calls in a '
                f'row at the same input, so every call would capture (does '
                f'a module set an attribute in its forward?)', forward, x)
        entry = self.graphs.get(key)
        if entry is None:
            if auto and launched is None and \
                    not self.recurrence.ready(inputs, model_key):
                return forward(x)
            try:
                *entry, self.pool = self.capture(forward, x, self.pool)
            except Exception as error:  # the capture's, or the model's
                return self._stop(failure('capturing it', error), forward,
                                  x)
            self.captures += 1
            if len(self.graphs) >= MAX_GRAPHS:
                self.graphs.pop(self._least_used(self.recurrence))
            entry = self.graphs[key] = (*entry, _held_with_storages(held))
        self.graphs.move_to_end(key)
        if key != launched:  # none launched, or another model's graph
            self._replay(entry, x)
        return tuple(o.clone() for o in entry[1])

    def release(self) -> None:
        """Drop the graphs and their memory pool (the inputs' counts stay:
        an input that recurred is captured again on its next call)."""
        self.graphs.clear()
        self.pool = self._last = None
        self._changes = 0

    @staticmethod
    def _replay(entry: tuple, x: torch.Tensor) -> None:
        """Replay a graph on ``x`` (into its static outputs)."""
        static, _, replay, _ = entry
        static.copy_(x)
        replay()


class _Step(nn.Module):
    """A model's forward as a module of its own, whose parameters are the
    model's, for the capture (:func:`capture_training_cuda`), which runs it
    on leaves of its own: the model's own ``forward`` stays as it is."""

    def __init__(self, model: nn.Module,
                 forward: Callable[[torch.Tensor], Outputs]) -> None:
        super().__init__()
        self.model = model
        self.__dict__['run'] = forward  # not a module attribute

    def forward(self, x: torch.Tensor) -> Outputs:
        return tuple(self.run(x))


def on_leaves_of_its_own(step: nn.Module
                         ) -> Tuple[Callable[..., Outputs],
                                    Tuple[torch.Tensor, ...],
                                    Tuple[torch.Tensor, ...]]:
    """``step`` as a function of its input and its parameters, new leaf
    tensors on the parameters' memory to capture it with (an in-place update
    of a parameter is theirs too), and the parameters, to replay it with.

    A capture's backward computes the gradients of those leaves, not of the
    parameters: a parameter's gradient accumulator lives while any autograd
    graph reaches it (the last step's outputs or losses still held, as
    mmengine's log values are; DistributedDataParallel's hooks, for good)
    and belongs to the stream it was made on, the default one, which a
    capture cannot make wait (CUDA: "operation not permitted when stream is
    capturing"); a leaf made now gets its accumulator on the capture's
    stream. A replay hands its gradients to the parameters themselves,
    through their accumulators and hooks as an eager backward does."""
    named = list(step.named_parameters())
    names = [name for name, _ in named]
    params = tuple(p for _, p in named)
    leaves = tuple(p.detach().requires_grad_(p.requires_grad) for p in params)

    def run(x: torch.Tensor, *tensors: torch.Tensor) -> Outputs:
        return tuple(torch.func.functional_call(
            step, dict(zip(names, tensors)), (x, )))
    return run, leaves, params


def capture_training_cuda(step: nn.Module, x: torch.Tensor, pool
                          ) -> Tuple[Callable[[torch.Tensor], Outputs],
                                     object]:
    """``step``'s forward and backward on ``x`` captured by
    ``torch.cuda.make_graphed_callables`` (after its warm-up iterations on a
    side stream) on leaves of its own (:func:`on_leaves_of_its_own`) in the
    memory pool ``pool`` (a new one if None), autocast's cache off (it would
    outlive the capture); returns the graphed forward, which takes the
    input alone, and the pool."""
    if pool is None:
        pool = torch.cuda.graph_pool_handle()
    run, leaves, params = on_leaves_of_its_own(step)
    mode = dict(capture_error_mode='thread_local') \
        if TRAINING_CAPTURE_THREAD_LOCAL else {}
    with _put_back_if_failed(x.device), _autocast_as_now(x.device.type):
        sample = x.detach().clone().requires_grad_(x.requires_grad)
        graphed = torch.cuda.make_graphed_callables(
            run, (sample, *leaves), allow_unused_input=True, pool=pool,
            **mode)
    # the parameters share the leaves' memory: nothing is copied in
    return (lambda x: graphed(x, *params)), pool


def pinning_threads() -> List[str]:
    """The names of the threads of data loaders that copy their batches
    into page-locked memory (``pin_memory=True``): PyTorch's DataLoader
    starts one per iterator, unnamed, so Python names it after its target,
    ``_pin_memory_loop``."""
    return [thread.name for thread in threading.enumerate()
            if thread.name.endswith('(_pin_memory_loop)')]


def not_graphable(model: nn.Module) -> Optional[str]:
    """Why ``model``'s training step cannot be captured, or None: gradient
    checkpointing (its recomputation saves and restores random states, which
    a capture cannot), SyncBatchNorm between processes (collectives
    inside a graph are not set up here), or a data loader's pinning thread
    while ``make_graphed_callables`` captures in CUDA's global mode (the
    thread's allocations of page-locked memory during the capture would
    break it and fail themselves, and the loader would raise their error
    at its next batch: the run would end)."""
    distributed = torch.distributed.is_available() and \
        torch.distributed.is_initialized() and \
        torch.distributed.get_world_size() > 1
    for module in model.modules():
        if getattr(module, 'with_cp', False):
            return 'gradient checkpointing (with_cp) is on'
        if distributed and isinstance(module, nn.SyncBatchNorm):
            return 'SyncBatchNorm synchronises between processes'
    pinning = [] if TRAINING_CAPTURE_THREAD_LOCAL else pinning_threads()
    if pinning:
        return (f'a data loader pins memory in a thread of its own '
                f'({pinning[0]}: pin_memory=True), whose CUDA calls would '
                f'break a capture in the global mode that this PyTorch\'s '
                f'make_graphed_callables captures in (pin_memory=False keeps '
                f'the training graphs)')
    return None


class _TrainingGraph:
    """One captured training step: the graphed forward, the autograd node
    of its last replay (a weak reference, until that replay's backward has
    run), the objects and memory of the model as captured (a replay
    launched after the model changed reads and writes only that), its
    BatchNorm statistics and their copies from before the last replay
    (restored when that replay is dropped), and whether the last look at
    the model found it unchanged."""

    __slots__ = ('forward', 'node', 'held', 'buffers', 'saved', 'trusted')

    def __init__(self, forward: Callable[[torch.Tensor], Outputs],
                 held: List[object], buffers: List[torch.Tensor],
                 saved: List[torch.Tensor]) -> None:
        self.forward = forward
        self.node: Optional[weakref.ref] = None
        self.held = _held_with_storages(held)
        self.buffers, self.saved = buffers, saved
        self.trusted = True

    def launch(self, x: torch.Tensor) -> Outputs:
        """Replay the forward on ``x``, the statistics it updates saved
        first (:meth:`drop` undoes the replay)."""
        _copy_all(self.saved, self.buffers)
        return self.forward(x)

    def drop(self) -> None:
        """Undo the last :meth:`launch` (its outputs unused): the
        statistics as before it, and the graph no longer launched before
        the model is looked at."""
        _copy_all(self.buffers, self.saved)
        self.trusted = False


class GraphedTraining(_Graphs):
    """A model's captured training steps, one per input (:func:`input_key`)
    and model (:func:`fingerprint`), captured once the input has come
    :data:`MIN_REPEATS` times (:class:`Recurrence`; ``'auto'``: in a row)
    with the model unchanged since the step before; the graphs of the
    :data:`MAX_TRAINING_GRAPHS` inputs that come most are kept
    (``'auto'``: :data:`AUTO_TRAINING_GRAPHS`; a new input replaces the
    least used graph only if it came :data:`ADMISSION` times as often), all
    in one memory pool (a step's activations once, however many graphs). A
    step's
    BatchNorm statistics are as an eager step leaves them (the capture's
    warm-up iterations are undone). The graph last replayed for an input
    is launched again before the model is looked at (the CPU's look runs
    while the GPU replays); if the model changed, that replay is dropped
    and its BatchNorm update undone, and the next steps look first until
    a graph of the model as it is has replayed. A forward while a replay's
    backward is still to come (two forwards before one backward) runs
    eagerly, as a replay or a capture in the shared pool would overwrite
    what that backward needs; the outputs and gradients are the caller's
    own, copied out as each replay ends (a later replay of another graph
    may write where they were). If a capture fails or the model cannot be
    captured (:func:`not_graphable`), one warning says so and training runs
    eagerly from then on; so too once a backward through a step was itself
    recorded (``create_graph=True``: a gradient penalty, whose second
    derivatives a replay cannot give). Not copied with the model."""

    STOPPED = ('CUDA graphs of the training steps stop: {reason}; '
               'training runs eagerly')
    REMEDY = 'model.backbone.cuda_graphs=True to graph inference only'
    #: why the steps stop once a backward through one was recorded
    RECORDED = ('a backward through the model was recorded '
                '(create_graph=True: second derivatives), which a replay '
                'does not record')
    #: the capture (a stand-in on the CPU in the tests)
    capture = staticmethod(capture_training_cuda)

    def __init__(self) -> None:
        self.graphs: 'OrderedDict[Hashable, _TrainingGraph]' = OrderedDict()
        self.pool = None
        self.failure: Optional[str] = None
        self.captures = 0
        # the inputs counted under 'auto' (in a row) and under 'train'
        self.recurrence = Recurrence(in_a_row=True)
        self.repeats = Recurrence(in_a_row=False)
        self.hooked = False  # the last look found hooks below the model
        self.recorded = False  # a backward through a step was recorded

    def __call__(self, model: nn.Module,
                 forward: Callable[[torch.Tensor], Outputs],
                 x: torch.Tensor, auto: bool = False) -> Outputs:
        """``forward(x)`` (``model``'s forward) in training: replayed from
        the graph of its input and model, captured once the input has
        recurred (``auto``: in a row), eagerly until then."""
        if self.failure is not None:
            return forward(x)
        if self.recorded:
            return self._stop(self.RECORDED, forward, x, auto=auto)
        eager = functools.partial(self._watched, forward)
        inputs = (*input_key(x), x.requires_grad)
        recurrence = self.recurrence if auto else self.repeats
        kept = AUTO_TRAINING_GRAPHS if auto else MAX_TRAINING_GRAPHS
        recurrence.count(inputs)
        latest = self._latest_for(inputs)
        if latest is None and not (recurrence.looks(inputs) and
                                   self._admits(inputs, recurrence, kept)):
            return eager(x)
        if self._backward_to_come():
            return eager(x)
        # while hooks were found, the model is looked at before a replay
        launched = latest is not None and self.graphs[latest].trusted and \
            not self.hooked
        if launched:
            outs = self.graphs[latest].launch(x)
        model_key, held = fingerprint(model)
        key = (*inputs, model_key)
        if launched:
            if key == latest:
                return self._handed_on(key, outs)
            del outs
            self.graphs[latest].drop()
        self.hooked = hooked_below(model_key)
        if self.hooked:
            return eager(x)
        entry = self.graphs.get(key)
        if entry is None:
            if not recurrence.ready(inputs, model_key):
                return eager(x)
            reason = not_graphable(model)
            if reason is not None:
                return self._stop(reason, forward, x, auto=auto)
            buffers = list(model.buffers())
            saved = [b.detach().clone() for b in buffers]
            try:
                graphed, self.pool = self.capture(_Step(model, forward), x,
                                                  self.pool)
            except Exception as error:  # the capture's, or the model's
                _copy_all(buffers, saved)
                return self._stop(
                    failure('capturing a training step', error), forward, x)
            _copy_all(buffers, saved)  # the warm-up iterations undone
            self.captures += 1
            while len(self.graphs) >= kept:
                self.graphs.pop(self._least_used(recurrence))
            self.graphs[key] = _TrainingGraph(graphed, held, buffers, saved)
        return self._handed_on(key, self.graphs[key].launch(x))

    def _watched(self, forward: Callable[[torch.Tensor], Outputs],
                 x: torch.Tensor) -> Outputs:
        """An eager step's ``forward(x)``, its backward watched
        (:meth:`_seen_backward`)."""
        outs = forward(x)
        for out in outs:
            if out.grad_fn is not None:
                out.grad_fn.register_hook(self._seen_backward)
        return outs

    def _seen_backward(self, grad_inputs: Outputs,
                       grad_outputs: Outputs) -> None:
        """A backward through a step ran; if it was recorded (autograd runs
        a ``create_graph=True`` backward with gradients on), the steps stop
        being captured and replayed at the next forward."""
        if torch.is_grad_enabled():
            self.recorded = True

    def _handed_on(self, key: Hashable, outs: Outputs) -> Outputs:
        """The outputs of the graph ``key``'s replay, as the caller's own,
        and the graph busy until the replay's backward has run."""
        self.graphs.move_to_end(key)
        entry = self.graphs[key]
        entry.trusted = True
        node = outs[0].grad_fn
        if node is not None:
            # alive until its backward has run or its outputs are gone
            entry.node = weakref.ref(node)
            node.register_hook(functools.partial(self._backward_done, entry))
        return tuple(o.clone() for o in outs)

    def _backward_to_come(self) -> bool:
        """A replay's backward is still to come: its graph's activations,
        in the memory pool the graphs share, must stay as they are until
        then, so no graph is replayed or captured."""
        return any(entry.node is not None and entry.node() is not None
                   for entry in self.graphs.values())

    def _backward_done(self, entry: _TrainingGraph, grad_inputs: Outputs,
                       grad_outputs: Outputs) -> Outputs:
        """After a replay's backward: the graph free for the next step, and
        copies of the gradients it computed passed on in place of the
        graph's buffers. A recorded backward (``create_graph=True``)
        cannot be given: the steps are eager from the next one on, and this
        one stops with a message."""
        entry.node = None
        self._seen_backward(grad_inputs, grad_outputs)
        if self.recorded:
            raise RuntimeError(
                'XCiT: this training step was replayed from a CUDA graph, '
                "whose backward (PyTorch's make_graphed_callables) is "
                'computed once and not recorded, so its gradients cannot '
                'be differentiated again (create_graph=True: a gradient '
                'penalty). The next steps run eagerly, where second '
                'derivatives are exact; to have them from the start, set '
                'model.backbone.cuda_graphs=True (inference graphs only) '
                'or False.')
        return copies(grad_inputs)
