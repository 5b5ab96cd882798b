"""Triton, where PyTorch ships it: the kernels' modules import it from here
and run only where :func:`available` says so."""
try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (a platform PyTorch ships without it)
    triton = tl = None


def available() -> bool:
    """Triton is importable (the kernels can be compiled for a GPU, or
    interpreted with ``TRITON_INTERPRET=1``)."""
    return triton is not None
