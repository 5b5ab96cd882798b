"""The backbone's forwards replayed from CUDA graphs (``cuda_graphs``).

On a GPU the eager backbone is bound by kernel launches; a graph replays an
inference forward (:class:`GraphedInference`) or a training step's forward
and backward (:class:`GraphedTraining`) in one launch. A graph is chosen by
the input (:func:`.keys.input_key`) and the model
(:func:`.keys.fingerprint`), looked at while the input's last graph
replays: a model changed since a capture is captured anew (in-place updates
of its parameters are read by the replay itself), one with hooks below it
runs eagerly, and under ``'auto'`` only inputs that recur are captured
(:mod:`.recurrence`). A failed capture: one warning, eager from then on.

The captures are PyTorch's (``torch.cuda.graph`` and a shared memory pool
for inference, ``torch.cuda.make_graphed_callables`` for a training step);
what is written here is what they leave to the caller:

* which graph, if any: both record one input shape and assume the model as
  it was at the capture, and a replay calls no hook;
* inference is captured by ``torch.cuda.graph`` in CUDA's thread-local
  mode, so a data loader's pinning thread neither breaks it nor fails;
  ``make_graphed_callables`` has no capture mode in PyTorch 2.11 and 2.12
  (it captures in the global mode), so there a training step is not
  captured while such a thread runs (:func:`not_graphable`);
* a training step is captured on leaves of its own
  (:func:`on_leaves_of_its_own`): ``make_graphed_callables`` differentiates
  the parameters themselves, whose gradient accumulators, made on the
  default stream, a capture cannot make wait (the H200's failed captures);
* its gradients leave as copies (:func:`copies`): its backward returns the
  graph's own buffers, which autograd makes a parameter's ``.grad`` as they
  are (tests/test_cuda_graphs_training.py shows it), for the next replay to
  overwrite;
* its warm-up iterations update BatchNorm's statistics; they are put back,
  as are those of a replay that is dropped;
* ``torch.cuda.graph`` ends a failed capture before it leaves the capture's
  stream: the stream and the random number generator are put back
  (:func:`.capture._put_back_if_failed`).

``torch.compile``'s CUDA-graph trees (``mode='reduce-overhead'``) would need
the backbone compiled, which the policy chooses on no device
(:data:`xcit_dense.models.policy.COMPILE`); a compiled forward is not
graphed here.
"""
from .capture import (
    Step,
    capture_cuda,
    capture_training_cuda,
    not_graphable,
    on_leaves_of_its_own,
    pinning_threads,
)
from .inference import GraphedInference
from .keys import applies, applies_to_training, fingerprint, input_key
from .training import GraphedTraining, copies

__all__ = [
    'GraphedInference', 'GraphedTraining', 'Step', 'applies',
    'applies_to_training', 'capture_cuda', 'capture_training_cuda',
    'copies', 'fingerprint', 'input_key', 'not_graphable',
    'on_leaves_of_its_own', 'pinning_threads'
]
