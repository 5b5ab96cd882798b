"""Choosing the checkpoint ``--resume`` without a path continues from: the
newest complete one of the work dir, a truncated or unreadable newer one
skipped and named."""
import os
import os.path as osp
import re
from typing import List, Mapping, Optional, Tuple

from ..errors import CheckpointError, UserError
from .files import read_checkpoint


def complete_checkpoints(work_dir: str) -> List[str]:
    """The checkpoints a run in ``work_dir`` may resume from, newest first:
    the one ``last_checkpoint`` names, then ``iter_*.pth`` / ``epoch_*.pth``
    by decreasing number."""
    from mmengine.runner import find_latest_checkpoint
    if not osp.isdir(work_dir):
        return []
    numbered = []
    for name in os.listdir(work_dir):
        m = re.fullmatch(r'(iter|epoch)_(\d+)\.pth', name)
        if m:
            numbered.append((m.group(1) == 'iter', int(m.group(2)),
                             osp.join(work_dir, name)))
    ordered = [p for *_, p in sorted(numbered, reverse=True)]
    latest = find_latest_checkpoint(work_dir)
    if latest:
        ordered = [latest] + [p for p in ordered
                              if osp.abspath(p) != osp.abspath(latest)]
    return ordered


def checkpoint_to_resume(work_dir: str
                         ) -> Tuple[Optional[str], Optional[Mapping]]:
    """The newest complete checkpoint of ``work_dir`` (``--resume`` without
    a path) and its contents, ``(None, None)`` if there is none; a truncated
    or unreadable newer one is skipped and named."""
    bad = []
    for path in complete_checkpoints(work_dir):
        try:
            checkpoint = read_checkpoint(path)
        except (CheckpointError, FileNotFoundError) as e:
            bad.append((path, e))
            continue
        if bad:
            print(f'The newest checkpoint {bad[0][0]} cannot be read '
                  f'({str(bad[0][1]).splitlines()[0]}); resuming from {path}, '
                  'the newest complete one.', flush=True)
        return path, checkpoint
    if bad:
        raise UserError(
            f'No checkpoint in {work_dir} can be resumed: '
            + '; '.join(f'{p} ({str(e).splitlines()[0]})' for p, e in bad))
    return None, None
