"""Token pieces for inference.

Without autograd, the token-wise layers run on pieces of tokens whose largest
temporary stays within :data:`PIECE_MIB`: glibc hands larger blocks back to
the OS on every free, and they are page-faulted in again on the next call,
which costs as much as the arithmetic on them (docs/performance.md, "What
the fast paths do"). With autograd, under ``torch.compile`` or on a device
other than the CPU (CUDA's caching allocator keeps freed blocks, and smaller
pieces would only launch more kernels) a layer runs on all its tokens at
once.
"""
from typing import Callable, List

import torch

from ..policy import SWITCHES

#: Largest temporary of one piece, in MiB.
PIECE_MIB: float = 24


def in_pieces(x: torch.Tensor) -> bool:
    """Layers on ``x`` run by pieces: eager inference on the CPU."""
    return not (torch.is_grad_enabled() or torch.compiler.is_compiling()
                or x.device.type != 'cpu')


def piece_tokens(n: int, width: int, x: torch.Tensor) -> int:
    """Tokens per piece of a layer on ``x`` whose widest temporary has
    ``width`` channels of ``x``'s dtype per token (all ``n`` unless
    :func:`in_pieces`)."""
    if not in_pieces(x):
        return n
    if SWITCHES.piece_tokens:
        return SWITCHES.piece_tokens
    return max(1, int(PIECE_MIB * 2**20) // (width * x.element_size()))


def pieces(n: int, width: int, x: torch.Tensor) -> List[slice]:
    """Ranges of ``n`` tokens of ``x`` processed one at a time: equal pieces
    of at most :func:`piece_tokens` (one range, written without a loop over
    ``n``, unless :func:`in_pieces`: a compiler tracing with dynamic shapes
    would otherwise specialise the graph to ``n``)."""
    if not in_pieces(x):
        return [slice(0, n)]
    count = -(-n // piece_tokens(n, width, x))
    size = -(-n // count)
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def assemble(x: torch.Tensor, ranges: List[slice], width: int,
             compute: Callable[[slice], torch.Tensor]) -> torch.Tensor:
    """``compute(range)`` of (B, N, C) tokens for every range, joined into a
    (B, N, width) tensor (no copy when there is one range)."""
    if len(ranges) == 1:
        return compute(ranges[0])
    out = x.new_empty(x.shape[0], x.shape[1], width)
    for sl in ranges:
        out[:, sl] = compute(sl)
    return out
