"""Files written to a temporary name and moved into place (atomically),
with the permissions of any new file."""
import os


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
