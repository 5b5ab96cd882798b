"""Deterministic synthetic datasets for the embedded demos and the tests."""
import json
import os
import os.path as osp
from typing import Callable, Iterable


def generate_once(out_dir: str, settings: dict, write: Callable[[], None],
                  outputs: Iterable[str] = ()) -> None:
    """Run ``write()`` unless ``out_dir`` already holds data made with these
    ``settings`` (and every path in ``outputs`` exists). The settings are
    recorded after writing, so an interrupted run is redone."""
    stamp = osp.join(out_dir, 'settings.json')
    try:
        with open(stamp) as f:
            done = json.load(f) == settings
    except (OSError, ValueError):
        done = False
    if done and all(osp.exists(p) for p in outputs):
        return
    write()
    os.makedirs(out_dir, exist_ok=True)
    with open(stamp, 'w') as f:
        json.dump(settings, f)
