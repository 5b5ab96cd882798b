"""Which inputs are captured and which graphs are kept: how often each
input came (:class:`Recurrence`), and what a model's inference graphs and
training graphs share (:class:`GraphSet`)."""
import logging
from collections import deque
from typing import Callable, Deque, Dict, Hashable, Optional, Tuple

import torch
from mmengine.logging import print_log

from .keys import Outputs

#: the calls over which inputs are counted (:class:`Recurrence`), and how
#: many times as often as the input of the least used of the graphs kept a
#: new input must have come to replace it; inputs that come about as often
#: as those kept run eagerly rather than each capture evicting a graph that
#: is captured again soon after (a capture costs about three eager calls)
WINDOW = 1024
ADMISSION = 2
#: times an input must have come (the model unchanged since the call
#: before) before it is captured (inference: under ``'auto'``)
MIN_REPEATS = 3


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



class GraphSet:
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

    def __deepcopy__(self, memo: Dict) -> 'GraphSet':
        return type(self)()

    def __getstate__(self) -> Dict:
        return {}

    def __setstate__(self, state: Dict) -> None:
        self.__init__()
