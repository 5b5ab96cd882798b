"""Training steps replayed from CUDA graphs (``XCiT(cuda_graphs='train')``):
:class:`GraphedTraining`."""
import functools
import weakref
from collections import OrderedDict
from typing import Callable, Hashable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from . import keys
from .capture import Step, capture_training_cuda, failure, not_graphable
from .keys import Outputs, held_with_storages, hooked_below, input_key
from .recurrence import GraphSet, Recurrence

#: training graphs kept (in one memory pool they share: one step's
#: activations, and each graph's outputs and gradients)
MAX_TRAINING_GRAPHS = 2
#: training graphs kept under ``cuda_graphs='auto'``
AUTO_TRAINING_GRAPHS = 1


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
        self.held = held_with_storages(held)
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


class GraphedTraining(GraphSet):
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
        model_key, held = keys.fingerprint(model)
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
                graphed, self.pool = self.capture(Step(model, forward), x,
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
