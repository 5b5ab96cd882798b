"""The fast-path switches: ``True``, ``'always'`` or ``False``, process-wide,
per model and per module.

Switch values: ``True`` (default) where :data:`~.policy.POLICY` says it
pays; ``'always'`` wherever it can run, whatever the device (for tests and
measurements); ``False`` never (the straightforward computation
everywhere). Set them with

* ``XCiT(fast_path=...)`` (a config key) or ``model.set_fast_path(...)`` for
  one model; each module's ``use_fast_path`` attribute for one module;
* :func:`set_fast_path` globally, or ``with fast_path(...):`` for a block of
  code (tests, ``tools/benchmark.py``'s ``@reference`` rows): one API for
  the three process-wide :class:`Switches` (the fast paths, the CPU's
  fused oneDNN kernels, the token pieces of CPU inference).

``False`` wins over ``'always'``, which wins over ``True``.
"""
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterator, Optional, Union

Setting = Union[bool, str]


@dataclass
class Switches:
    """The process-wide switches, read on every call (set them with
    :func:`set_fast_path` or ``with fast_path(...):``).

    Attributes:
        fast_path: ``True`` (default), ``'always'`` or ``False`` for every
            model (combined with each model's and module's own setting).
        fused_kernels: the CPU fast paths' oneDNN GEMMs and convolutions
            with fused epilogues (``ops/onednn.py``); ``False``: the
            standard PyTorch operators in the same fast paths.
        piece_tokens: tokens per piece of CPU inference (``ops/pieces.py``);
            ``None`` (default): sized by memory; a number: exactly that
            many (tests of ragged pieces).
    """
    fast_path: Setting = True
    fused_kernels: bool = True
    piece_tokens: Optional[int] = None


SWITCHES = Switches()
_KEEP = object()  # a switch not given: left as it is


def check_setting(enabled: Setting) -> Setting:
    """``enabled`` if it is a valid switch value; one paragraph otherwise."""
    if not (isinstance(enabled, bool) or enabled == 'always'):
        raise ValueError(
            f'fast_path must be True (where the measured policy says it '
            f"pays), 'always' (wherever it can run) or False (never), got "
            f'{enabled!r}')
    return enabled


def set_fast_path(enabled: Setting = _KEEP, *, fused_kernels: bool = _KEEP,
                  piece_tokens: Optional[int] = _KEEP) -> None:
    """Set the process-wide :class:`Switches` (those not given stay as they
    are): ``set_fast_path(False)``, ``set_fast_path(fused_kernels=False)``,
    ``set_fast_path(piece_tokens=7)``."""
    if enabled is not _KEEP:
        SWITCHES.fast_path = check_setting(enabled)
    if fused_kernels is not _KEEP:
        if not isinstance(fused_kernels, bool):
            raise ValueError(f'fused_kernels must be True or False, got '
                             f'{fused_kernels!r}')
        SWITCHES.fused_kernels = fused_kernels
    if piece_tokens is not _KEEP:
        if piece_tokens is not None and not (
                isinstance(piece_tokens, int) and piece_tokens > 0):
            raise ValueError(f'piece_tokens must be None (sized by memory) '
                             f'or a positive int, got {piece_tokens!r}')
        SWITCHES.piece_tokens = piece_tokens


@contextmanager
def fast_path(enabled: Setting = _KEEP, *, fused_kernels: bool = _KEEP,
              piece_tokens: Optional[int] = _KEEP) -> Iterator[None]:
    """:func:`set_fast_path` for a block of code, the previous switches
    restored after: ``with fast_path(False):`` runs every module's
    straightforward computation inside the block (``'always'``: every fast
    path that can run); ``with fast_path(fused_kernels=False):`` the fast
    paths with standard operators."""
    previous = replace(SWITCHES)
    set_fast_path(enabled, fused_kernels=fused_kernels,
                  piece_tokens=piece_tokens)
    try:
        yield
    finally:
        set_fast_path(previous.fast_path,
                      fused_kernels=previous.fused_kernels,
                      piece_tokens=previous.piece_tokens)


def combined(*settings: Setting) -> Setting:
    """One setting from several (global, model, module): ``False`` wins over
    ``'always'``, which wins over ``True``."""
    if any(s is False for s in settings):
        return False
    return 'always' if 'always' in settings else True
