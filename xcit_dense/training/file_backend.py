"""Checkpoints that are either whole or absent."""
import os
import os.path as osp
import tempfile
from pathlib import Path
from typing import Union

from mmengine.fileio import LocalBackend, register_backend

from ..atomic_files import move_into_place


class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend, writing each file to a temporary name
    in the same directory, flushed to disk, then renamed into place: a
    process killed while writing leaves the previous file (or none), never a
    truncated one under the final name.

    Selected with ``backend_args=dict(backend='atomic_local')`` wherever
    mmengine takes file-backend arguments (the recipes set it for the
    checkpoint hook).
    """

    def put(self, obj: bytes, filepath: Union[str, Path]) -> None:
        filepath = str(filepath)
        directory = osp.dirname(osp.abspath(filepath))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            dir=directory, prefix=f'.{osp.basename(filepath)}.', suffix='.tmp')
        try:
            with os.fdopen(fd, 'wb') as f:
                f.write(obj)
                f.flush()
                os.fsync(f.fileno())
            move_into_place(tmp, filepath)
        except BaseException:
            if osp.exists(tmp):
                os.remove(tmp)
            raise

    def put_text(self, obj: str, filepath: Union[str, Path],
                 encoding: str = 'utf-8') -> None:
        self.put(obj.encode(encoding), filepath)


register_backend('atomic_local', AtomicLocalBackend)
