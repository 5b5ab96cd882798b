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
