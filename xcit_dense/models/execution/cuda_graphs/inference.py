"""Inference replayed from CUDA graphs (``XCiT(cuda_graphs=True)``):
:class:`GraphedInference`."""
import threading
from collections import OrderedDict
from typing import Callable, Hashable, Optional

import torch
import torch.nn as nn

from . import keys
from .capture import capture_cuda, failure
from .keys import Outputs, held_with_storages, hooked_below, input_key
from .recurrence import GraphSet, Recurrence

#: inference graphs kept per model, those of the inputs that come most
#: (each holds its outputs; their activations share one memory pool)
MAX_GRAPHS = 8
#: calls in a row with the model changed at the same input after which the
#: graphs stop
MAX_CHANGES = 3


class GraphedInference(GraphSet):
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
        model_key, held = keys.fingerprint(model)
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
            entry = self.graphs[key] = (*entry, held_with_storages(held))
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
