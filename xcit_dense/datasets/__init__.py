"""Deterministic synthetic datasets for the embedded demos and the tests."""
import json
import os
import os.path as osp
import re
from typing import Callable, Iterable, Iterator

from ..errors import UserError

#: the files each generator writes below its folder, as (folder, file name
#: pattern): what a new generation removes first, and what tells the kind
#: of the data a folder holds
WRITTEN = {
    'coco': (('train', r'\d{5}\.png'), ('val', r'\d{5}\.png'),
             ('annotations', r'(train|val)\.json')),
    'ade20k': tuple((f'{sub}/{split}', rf'{split[:5]}_\d{{5}}\.{ext}')
                    for split in ('training', 'validation')
                    for sub, ext in (('images', 'jpg'),
                                     ('annotations', 'png'))),
}


def generated_files(out_dir: str, kind: str) -> Iterator[str]:
    """The files in ``out_dir`` that the ``kind`` generator writes."""
    for folder, pattern in WRITTEN[kind]:
        path = osp.join(out_dir, folder)
        if osp.isdir(path):
            for name in sorted(os.listdir(path)):
                if re.fullmatch(pattern, name):
                    yield osp.join(path, name)


def remove_generated(out_dir: str, kind: str) -> None:
    """Remove what an earlier ``kind`` generation wrote in ``out_dir``, and
    its folders where that leaves them empty; other files stay."""
    for path in list(generated_files(out_dir, kind)):
        os.remove(path)
    for folder, _ in WRITTEN[kind]:
        while folder:
            try:
                os.rmdir(osp.join(out_dir, folder))
            except OSError:  # missing, or holding other files
                break
            folder = osp.dirname(folder)


def generate_once(out_dir: str, settings: dict, write: Callable[[], None],
                  outputs: Iterable[str] = ()) -> None:
    """Run ``write()`` unless ``out_dir`` already holds data made with these
    ``settings`` (and every path in ``outputs`` exists). The settings, with
    the dataset's ``kind`` (a key of :data:`WRITTEN`), are recorded after
    writing, so an interrupted run is redone. Before writing, what an
    earlier generation of that kind wrote is removed, so that the folder
    holds exactly the new dataset; a folder holding another kind's data is
    refused."""
    kind = settings['kind']
    others = [other for other in WRITTEN if other != kind
              and next(generated_files(out_dir, other), None) is not None]
    if others:
        raise UserError(
            f'{out_dir} holds a synthetic {others[0]} dataset; writing the '
            f'{kind} one into it would mix the two. Give another folder, or '
            f'delete that dataset first.')
    stamp = osp.join(out_dir, 'settings.json')
    try:
        with open(stamp) as f:
            recorded = json.load(f)
        # recorded before the kind was: the files above say it is this one
        recorded.setdefault('kind', kind)
        done = recorded == settings
    except (OSError, ValueError, AttributeError):
        done = False
    if done and all(osp.exists(p) for p in outputs):
        return
    if osp.isfile(stamp):
        os.remove(stamp)
    remove_generated(out_dir, kind)
    write()
    os.makedirs(out_dir, exist_ok=True)
    with open(stamp, 'w') as f:
        json.dump(settings, f)
