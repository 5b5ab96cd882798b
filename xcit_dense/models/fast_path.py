"""The one switch between the fast and the straightforward computation.

Every module of the backbone that has a fast path (stem, positional encoding,
XCA, LPI, MLP, block, pyramid up-sampler) keeps its straightforward
computation beside it in the same ``forward`` and takes the fast one only
when :func:`applies` says so: the switch is on (globally and for that
module), the module is exactly the class the fast path was written for (a
subclass, a wrapper or a replacement runs its own ``forward``), and the
module checks its own parts and state (exact child types, dropout that is
really inactive, ...) before it uses them.

Switches:

* ``XCiT(fast_path=False)`` (a config key) or ``model.set_fast_path(False)``
  for one model; each module's ``use_fast_path`` attribute for one module;
* :func:`set_fast_path` globally, or ``with fast_path(False):`` for a block
  of code (tests, ``tools/benchmark.py``'s ``@reference`` rows).
"""
from contextlib import contextmanager
from typing import Iterator

import torch.nn as nn
from timm.layers import DropPath

_enabled = True


def set_fast_path(enabled: bool) -> None:
    """Allow (default) or forbid every fast path, for all models."""
    global _enabled
    _enabled = bool(enabled)


def fast_path_enabled() -> bool:
    return _enabled


@contextmanager
def fast_path(enabled: bool) -> Iterator[None]:
    """``with fast_path(False):`` runs every module's straightforward
    computation inside the block; the previous setting is restored after."""
    previous = _enabled
    set_fast_path(enabled)
    try:
        yield
    finally:
        set_fast_path(previous)


def applies(module: nn.Module, cls: type) -> bool:
    """The fast path written for ``cls`` may run for ``module``: the switch
    is on for it, and it is an instance of exactly ``cls``."""
    return _enabled and module.use_fast_path and type(module) is cls


def is_inactive(module: nn.Module) -> bool:
    """``module`` is an identity now: ``nn.Identity``, or an ``nn.Dropout``
    / timm ``DropPath`` that is in eval mode or has rate 0. Anything else
    (another class, live dropout) may act and is called."""
    if type(module) is nn.Identity:
        return True
    if type(module) is nn.Dropout:
        return not module.training or module.p == 0
    if type(module) is DropPath:
        return not module.training or module.drop_prob == 0
    return False


def is_exact_gelu(module: nn.Module) -> bool:
    """``module`` is ``nn.GELU()`` with the exact (erf) formula, which the
    fused kernels compute."""
    return type(module) is nn.GELU and module.approximate == 'none'


def is_plain_conv(conv: nn.Module) -> bool:
    """An ``nn.Conv2d`` / ``nn.ConvTranspose2d`` with zero padding and no
    dilation (what the fast kernels compute)."""
    return type(conv) in (nn.Conv2d, nn.ConvTranspose2d) and \
        conv.padding_mode == 'zeros' and \
        not isinstance(conv.padding, str) and \
        all(d == 1 for d in conv.dilation)
