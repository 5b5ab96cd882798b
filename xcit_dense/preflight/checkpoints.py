"""Pre-flight checks of the checkpoints a run reads: the backbone's
pretrained weights, and a checkpoint to test, resume or start from, each
readable and fitting the config's model."""
import copy
import os.path as osp
from typing import Mapping, Optional, Tuple

import torch.nn as nn

from ..checkpoint import (
    backbone_weights,
    is_url,
    local_checkpoint,
    read_checkpoint,
)
from ..errors import CheckpointError, UserError


def check_pretrained(cfg, backbone: Optional[nn.Module]) -> None:
    """The backbone's ``Pretrained`` checkpoint (its ``init_cfg``, a dict or
    an entry of a list) must be readable (a URL is downloaded here, once,
    and the config pointed at the local copy) and, where the backbone is
    XCiT, hold its weights under the entry's ``prefix`` with their names
    and shapes (checked against the meta-device ``backbone``, as the
    strict import will check them)."""
    from ..models.presets import init_cfgs
    init = ((cfg.get('model') or {}).get('backbone') or {}).get('init_cfg')
    for entry in init_cfgs(init):
        if entry.get('type') != 'Pretrained':
            continue
        what = 'pretrained checkpoint'
        entry['checkpoint'], contents = read_checked(entry.get('checkpoint'),
                                                     what)
        if backbone is None:
            continue
        try:
            backbone_weights(backbone, contents, entry.get('checkpoint_key'),
                             entry.get('prefix'))
        except CheckpointError as e:
            raise UserError(
                f'The {what} {entry["checkpoint"]} cannot initialise the '
                f'backbone (model.backbone.init_cfg): {e}')


def read_checked(path: str, what: str) -> Tuple[str, Mapping]:
    """The local path of the checkpoint at ``path`` (a file or an http(s)
    URL, downloaded once into torch's hub cache) and its contents; a missing
    or unreadable one is a :class:`UserError` naming ``what`` it is."""
    hint = (' Pass a local file or an http(s) URL, e.g. --cfg-options '
            'model.backbone.init_cfg.checkpoint=PATH_OR_URL.'
            if 'pretrained' in what else '')
    if not is_url(path) and not osp.isfile(str(path)):
        raise UserError(f'The {what} does not exist: {path}.{hint}')
    try:
        local = local_checkpoint(path)
        return local, read_checkpoint(local)
    except CheckpointError as e:
        raise UserError(f'The {what} cannot be used: {e}')


def check_checkpoint(path: str, what: str) -> str:
    """Check the checkpoint at ``path`` (see :func:`read_checked`) and
    return its local path."""
    return read_checked(path, what)[0]


def check_fits(cfg, checkpoint: Mapping, allow_new_classes: bool) -> None:
    """The weights of ``checkpoint`` (ours or published) must fit the
    config's model as the runner will check them when it loads them
    (:class:`~xcit_dense.hooks.CheckpointImportHook`), so that a checkpoint
    of another model ends the run before its work dir is written. The model
    is built on PyTorch's meta device (no memory, no weights; 0.2 to 2 s);
    one that cannot be built there is checked when the runner loads it."""
    import warnings

    import torch

    from ..checkpoint.published import model_weights
    from ..toolkits import use_toolkit
    model = cfg.get('model') or {}
    if str(model.get('type', '')).endswith('TTAModel'):
        model = model.get('module') or {}
    # a copy: some models edit their config as they build (mmdet's
    # DeformableDETR sets its head's arguments), and the runner builds it
    model = copy.deepcopy(model)
    try:
        registry = use_toolkit(cfg.get('default_scope'))
        # the runner builds it again and says what it warns about
        with warnings.catch_warnings(), torch.device('meta'):
            warnings.simplefilter('ignore')
            state = registry.MODELS.build(model).state_dict()
    except Exception:  # noqa: BLE001 (any error of any model's code)
        return
    try:
        model_weights(checkpoint, state, allow_new_classes,
                      log=lambda _: None)
    except CheckpointError as e:
        raise UserError(str(e)) from e
