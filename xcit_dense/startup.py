"""A process's start: the imports of the stack without the garbage
collector walking them.

Importing torch, timm and mmengine creates a few million objects that
live as long as the process. CPython's collector runs a full collection
each time the long-lived objects have grown by a quarter, so while they
accumulate it walks all of them again and again: about a quarter of
``import xcit_dense`` (2-core Intel Xeon, 2026-11-27: 9.3 -> 6.6 s of a
new interpreter's ``python -c 'import xcit_dense'``). Nothing is lost by
pausing it there: the imports' objects are not garbage, and what cyclic
garbage they leave is collected by the first collection after."""
import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def collections_paused() -> Iterator[None]:
    """Inside, no automatic garbage collection; after it, the collector as
    it was (left off if the caller had turned it off)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
