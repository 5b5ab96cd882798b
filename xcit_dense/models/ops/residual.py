"""A branch added to the residual stream through its layer scale,
``x + gamma * y``, in one pass each way.

``torch.addcmul(x, gamma, y)`` computes it in one kernel, but autograd's
backward of ``addcmul`` multiplies by its ``value`` (1) before each product:
four products, a sum and a cast. Here the backward is what the arithmetic
needs: ``gamma``'s gradient (the gradient times ``y``, summed over the
tokens) and ``y``'s (the gradient times ``gamma``, written in ``y``'s dtype by
the product itself), bit for bit autograd's values; a recorded backward
(:mod:`.higher_order`) computes them as autograd's own products.
"""
import torch

from . import higher_order


class _ScaledResidual(torch.autograd.Function):
    """(x, gamma, y) -> ``x + gamma * y``; the gradient passes to ``x`` as
    it is."""

    @staticmethod
    def forward(ctx, x, gamma, y):
        ctx.save_for_backward(gamma, y)
        return torch.addcmul(x, gamma, y)

    @staticmethod
    def backward(ctx, grad):
        gamma, y = ctx.saved_tensors
        need_x, need_gamma, need_y = ctx.needs_input_grad
        grad_gamma = grad_y = None
        if need_gamma:
            grad_gamma = (grad * y).sum(tuple(range(grad.dim() - 1))) \
                .to(gamma.dtype)
        if need_y and higher_order.recorded():
            grad_y = (grad * gamma).to(y.dtype)
        elif need_y:
            grad_y = torch.mul(grad, gamma, out=torch.empty_like(y))
        return grad if need_x else None, grad_gamma, grad_y


def scaled_residual(x: torch.Tensor, gamma: torch.Tensor,
                    y: torch.Tensor) -> torch.Tensor:
    """``x + gamma * y`` for (..., C) ``x`` and ``y`` and a (C,) ``gamma``:
    ``torch.addcmul``; where autograd records, with the backward above."""
    if torch.is_grad_enabled() and (x.requires_grad or gamma.requires_grad
                                    or y.requires_grad):
        return _ScaledResidual.apply(x, gamma, y)
    return torch.addcmul(x, gamma, y)
