"""The model index: the published XCiT detectors and segmentors with their
configs, published metrics, weights and the ImageNet checkpoints they start
from, in OpenMMLab's format (``model-index.yml`` importing
``configs/*/metafile.yml``).

``pip install .`` copies the index, the configs and the tools into
``xcit_dense/.mim`` as mmdet does, where ``mim`` looks for them; from a
source checkout they are read in place. The tools accept a model's name
wherever they take a config file.
"""
import os.path as osp
from functools import lru_cache
from typing import Dict, Optional

import yaml

PACKAGE_DIR = osp.dirname(osp.abspath(__file__))


def index_root() -> str:
    """The directory holding ``model-index.yml`` and ``configs/``: the
    installed ``.mim`` copy, else the source checkout."""
    installed = osp.join(PACKAGE_DIR, '.mim')
    if osp.isfile(osp.join(installed, 'model-index.yml')):
        return installed
    return osp.dirname(PACKAGE_DIR)


@lru_cache()
def models() -> Dict[str, dict]:
    """Every model of the index by name, with ``Config`` made absolute."""
    root = index_root()
    path = osp.join(root, 'model-index.yml')
    if not osp.isfile(path):
        return {}
    with open(path) as f:
        index = yaml.safe_load(f) or {}
    found = {}
    for metafile in index.get('Import', []):
        with open(osp.join(root, metafile)) as f:
            for model in (yaml.safe_load(f) or {}).get('Models', []):
                model = dict(model)
                model['Config'] = osp.join(root, model['Config'])
                found[model['Name']] = model
    return found


def config_file(name_or_path: str) -> Optional[str]:
    """The config file for a path or a model name of the index (with or
    without ``.py``); None if neither."""
    if osp.isfile(name_or_path):
        return name_or_path
    name = osp.splitext(osp.basename(name_or_path))[0]
    model = models().get(name)
    return model['Config'] if model else None


def model_for_weights(path_or_url: str) -> Optional[dict]:
    """The index entry whose published weights have the file name of
    ``path_or_url``, if any."""
    name = osp.basename(str(path_or_url))
    for model in models().values():
        if osp.basename(model.get('Weights', '')) == name:
            return model
    return None
