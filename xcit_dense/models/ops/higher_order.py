"""Gradients that are themselves differentiated.

The fast paths' autograd functions compute their gradients in kernels, in
place or into preallocated outputs, which autograd does not record. Where a
backward is itself recorded (``torch.autograd.grad(..., create_graph=True)``:
gradient penalties, double backpropagation, meta-learning's inner steps),
they differentiate their straightforward computation instead, recomputed
from the inputs they saved: the same gradients, and their derivatives those
of the straightforward computation.
"""
from typing import Callable, Optional, Sequence, Tuple

import torch


def recorded() -> bool:
    """The backward running now is itself recorded for autograd
    (``create_graph=True``: autograd runs backward with gradients on)."""
    return torch.is_grad_enabled()


def gradients(reference: Callable[..., torch.Tensor],
              inputs: Sequence[Optional[torch.Tensor]],
              needs: Sequence[bool], grad: torch.Tensor
              ) -> Tuple[Optional[torch.Tensor], ...]:
    """The gradients of ``reference(*inputs)`` for ``grad`` with respect to
    the inputs that ``needs`` marks (None for the others), recorded for
    autograd: ``reference`` is the computation an autograd function's
    forward computes, ``inputs`` what it was given (as its backward gets
    them back from ``ctx.saved_tensors``, still joined to the graph)."""
    wanted = [i for i, need in enumerate(needs) if need]
    with torch.enable_grad():
        out = reference(*inputs)
        got = torch.autograd.grad(out, [inputs[i] for i in wanted], grad,
                                  create_graph=True, allow_unused=True)
    result = [None] * len(inputs)
    for i, g in zip(wanted, got):
        result[i] = torch.zeros_like(inputs[i]) if g is None else g
    return tuple(result)
