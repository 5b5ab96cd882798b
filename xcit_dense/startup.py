"""A process's start: the imports of the stack without the garbage
collector walking them.

Importing torch, timm and mmengine creates a few hundred thousand objects
that live as long as the process. CPython's collector runs a full
collection each time the long-lived objects have grown by a quarter, so
while they accumulate it walks all of them again and again (hundreds of
collections during ``import xcit_dense``; a handful with the pause).
Nothing is lost by pausing it there: the imports' objects are not garbage,
and what cyclic garbage they leave is found by the first collection after,
which looks at everything allocated in the pause."""
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
