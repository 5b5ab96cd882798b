"""A parameter whose gradient comes back in the parameter's own strides.

A convolution on channels-last maps returns its weight gradient in
channels-last strides. For a depth-wise weight (C, 1, 3, 3) those are
(9, 1, 3, 1) where the parameter has (9, 9, 3, 1): the same memory order
(dimension 1 has size 1), so autograd's layout contract accepts the gradient
as it is, but DistributedDataParallel compares strides exactly and copies it
into its bucket, warning ``Grad strides do not match bucket view strides``.
"""
import torch


class _OwnGradLayout(torch.autograd.Function):

    @staticmethod
    def forward(ctx, param):
        ctx.stride = param.stride()
        return param.view_as(param)

    @staticmethod
    def backward(ctx, grad):
        if grad.stride() == ctx.stride:
            return grad
        return grad.new_empty_strided(grad.shape, ctx.stride).copy_(grad)


def with_own_grad_layout(param: torch.Tensor) -> torch.Tensor:
    """``param`` for a computation whose gradient may come back in other
    strides (a convolution on channels-last maps): the gradient is handed to
    ``param`` in ``param``'s own strides. Without autograd, ``param``
    itself."""
    if not (param.requires_grad and torch.is_grad_enabled()):
        return param
    return _OwnGradLayout.apply(param)
