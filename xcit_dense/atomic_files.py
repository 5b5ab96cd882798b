"""Files written to a temporary name and moved into place (atomically),
with the permissions of any new file."""
import os
import os.path as osp
import tempfile
from contextlib import contextmanager
from typing import Iterator


def new_file_mode() -> int:
    """The mode ``open(path, 'w')`` gives a new file under the process's
    umask (``tempfile.mkstemp`` creates its files readable by the owner
    only, and a rename keeps that)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def move_into_place(tmp: str, path: str) -> None:
    """Rename the finished ``tmp`` to ``path`` (atomic on one file system),
    with the mode of a new file."""
    os.chmod(tmp, new_file_mode())
    os.replace(tmp, path)


@contextmanager
def unverified_file(path: str, suffix: str = '') -> Iterator[str]:
    """A temporary name next to ``path`` (its folder made if missing) for a
    file that is checked before :func:`move_into_place` moves it there;
    whatever is left under that name on leaving (a failed check, an error)
    is removed."""
    directory = osp.dirname(osp.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix='.unverified-', suffix=suffix,
                                   dir=directory)
    os.close(fd)
    try:
        yield partial
    finally:
        if osp.exists(partial):
            os.remove(partial)
