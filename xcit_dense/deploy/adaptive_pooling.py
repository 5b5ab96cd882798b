"""Adaptive average pooling for any input size, in an exported graph.

PyTorch's ``adaptive_avg_pool2d`` to ``(oh, ow)`` cells averages, for cell
``i`` of ``n`` rows, rows ``floor(i n / oh)`` up to ``ceil((i + 1) n / oh)``
(likewise columns). ONNX's exporters turn it into an ``AveragePool`` whose
window is fixed at the size it was traced at, so an export with free height
and width (UperNet's pyramid pooling to 1, 2, 3 and 6 cells) computes wrong
cells at any other size. Here the same bins are computed from the actual
size inside the graph: one averaging matrix per axis (``oh x n``: 1 / the
bin's length inside the bin, 0 elsewhere), and the pooled map is
``rows @ x @ cols^T``: the same averages as PyTorch's, up to float rounding.

:data:`DECOMPOSITIONS` replaces the operator in an exported program
(``ExportedProgram.run_decompositions``, which traces the program again);
:class:`AnySizePooling` replaces it while ``torch.export`` traces Python
(non-strict), the same graph in one trace. The model's own modules are not
touched and run as they are in PyTorch.
"""
import torch
import torch.nn.functional as F
from torch.nn.modules.utils import _list_with_default, _pair
from torch.overrides import TorchFunctionMode


def bin_matrix(n: torch.SymInt, cells: int, like: torch.Tensor
               ) -> torch.Tensor:
    """The (cells, n) averaging matrix of PyTorch's adaptive pooling of
    ``n`` positions to ``cells``, in ``like``'s dtype and device."""
    cell = torch.arange(cells, device=like.device)
    start = (cell * n) // cells
    end = ((cell + 1) * n + cells - 1) // cells  # ceil, non-negative
    pos = torch.arange(n, device=like.device)
    inside = (pos[None, :] >= start[:, None]) & (pos[None, :] < end[:, None])
    return inside.to(like.dtype) / (end - start)[:, None].to(like.dtype)


def adaptive_avg_pool2d_any_size(x: torch.Tensor, output_size
                                 ) -> torch.Tensor:
    """``F.adaptive_avg_pool2d(x, output_size)`` with the bins computed from
    ``x``'s size at run time (``output_size``: two ints)."""
    rows = bin_matrix(x.shape[-2], output_size[0], x)
    cols = bin_matrix(x.shape[-1], output_size[1], x)
    return rows @ x @ cols.transpose(0, 1)


DECOMPOSITIONS = {
    torch.ops.aten.adaptive_avg_pool2d.default: adaptive_avg_pool2d_any_size,
}


class AnySizePooling(TorchFunctionMode):
    """While active, ``F.adaptive_avg_pool2d`` is
    :func:`adaptive_avg_pool2d_any_size` (an output size of one int: square;
    ``None``: the input's)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.adaptive_avg_pool2d:
            return func(*args, **kwargs)
        x, size = (*args, *kwargs.values())
        return adaptive_avg_pool2d_any_size(
            x, _list_with_default(_pair(size), x.size()))
