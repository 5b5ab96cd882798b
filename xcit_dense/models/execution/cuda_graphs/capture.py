"""The captures: a forward in a CUDA graph (:func:`capture_cuda`), a
training step by ``torch.cuda.make_graphed_callables``
(:func:`capture_training_cuda`), what a training step's capture needs
(:class:`Step`, :func:`on_leaves_of_its_own`) and cannot take
(:func:`not_graphable`), and what a failed capture leaves put back
(:func:`_put_back_if_failed`) and says (:func:`failure`)."""
import contextlib
import inspect
import os.path as osp
import threading
from typing import Callable, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn

from ....errors import cause_line
from .keys import Outputs

#: ``make_graphed_callables`` can capture in CUDA's thread-local mode (its
#: ``capture_error_mode``: newer PyTorch); else it captures in the global
#: mode, which other threads' CUDA calls break (:func:`not_graphable`)
TRAINING_CAPTURE_THREAD_LOCAL = 'capture_error_mode' in inspect.signature(
    torch.cuda.make_graphed_callables).parameters


#: PyTorch's own files: a failed capture's warning names the innermost line
#: outside them (:func:`failure`)
_TORCH = osp.dirname(torch.__file__) + osp.sep


def _autocast_as_now(device: str) -> torch.autocast:
    """The caller's autocast state on ``device``, its cache of cast
    weights off (it would outlive a capture)."""
    return torch.autocast(
        device, dtype=torch.get_autocast_dtype(device),
        enabled=torch.is_autocast_enabled(device), cache_enabled=False)



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



class Step(nn.Module):
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
