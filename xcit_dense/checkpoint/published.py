"""Whole detectors and segmentors in the layout the XCiT authors published.

The 24 released models (facebookresearch/xcit ``detection/README.md`` and
``semantic_segmentation/README.md``) were saved by mmcv 1.3 runners from
mmdet 2.11 and mmseg 0.11: ``{'meta': {..., 'CLASSES': ..., 'PALETTE': ...},
'state_dict': ..., 'optimizer': ..., 'amp': ...}``. Their weights differ from
the layout of mmdet 3.3 / mmseg 1.2 with this backbone in one name only, the
positional encoder (``backbone.pos_embeder.`` -> ``backbone.pos_embed.``):
the published backbone (``detection/backbone/xcit.py``, identical to the
segmentation one but for imports) has no class token, class-attention
blocks, final norm or head, and the FPN neck, RPN head, RoI heads, UPerHead,
FCNHead and FPNHead kept their parameter names between those toolkit
versions (see docs/checkpoints.md, "Use a published model", for how this was
verified).

:func:`convert_published` maps a published checkpoint to ours in memory;
:func:`check_model_weights` compares any whole-model state dict with a model,
strictly, allowing only the class-dependent output layers to differ in shape
when fine-tuning to other classes; :func:`model_weights` does both for any
whole-model checkpoint (the one implementation the Runner's
``CheckpointImportHook`` and :func:`load_model_checkpoint` share), and
:func:`refuse_resume` is the rule for resuming from a published one.
"""
import re
from typing import Dict, List, Mapping, Optional, Tuple

import torch

from ..errors import CheckpointError
from .keys import PUBLISHED_NAMES, mismatch_paragraph, without_module_prefix

# Every difference of the published weights' names from ours: the
# backbone's (which it also reads itself when loading).
RENAMED = tuple((f'backbone.{old}', f'backbone.{new}')
                for old, new in PUBLISHED_NAMES)
# Top-level entries of the published files that are not the model: the
# optimizer and apex AMP states of the mmcv 1.x runner.
TRAINING_STATE = ('optimizer', 'amp')
# Output layers whose shapes follow the number of classes (mmdet's
# Shared2FCBBoxHead and FCNMaskHead, mmseg's decode heads).
CLASS_LAYERS = re.compile(
    r'^(roi_head\.bbox_head\.(fc_cls|fc_reg)|roi_head\.mask_head\.conv_logits'
    r'|decode_head\.conv_seg|auxiliary_head\.conv_seg)\.')


def toolkit_of(meta: Mapping) -> Optional[str]:
    """``'mmdet 2.x'`` / ``'mmseg 0.x'`` for a checkpoint ``meta`` written by
    those versions, else None."""
    for key, name, old in (('mmdet_version', 'mmdet', '2.'),
                           ('mmseg_version', 'mmseg', '0.')):
        version = str(meta.get(key, ''))
        if version.startswith(old):
            return f'{name} {version}'
    return None


def is_published(checkpoint: Mapping) -> bool:
    """Whether ``checkpoint`` is a whole model in the published layout."""
    if not isinstance(checkpoint, Mapping):
        return False
    state_dict = checkpoint.get('state_dict')
    meta = checkpoint.get('meta')
    if not isinstance(state_dict, Mapping):
        return False
    if isinstance(meta, Mapping) and toolkit_of(meta):
        return True
    old = tuple(src for src, _ in RENAMED)
    return any(str(k).startswith(old) for k in state_dict)


def dataset_meta_of(meta: Mapping) -> Dict:
    """Class names (and palette) of a checkpoint's ``meta``, as mmengine's
    ``dataset_meta`` (``classes``, ``palette``); ``{}`` if it has none."""
    if isinstance(meta.get('dataset_meta'), Mapping):
        return {str(k).lower(): v for k, v in meta['dataset_meta'].items()}
    out = {}
    if meta.get('CLASSES') is not None:
        out['classes'] = tuple(meta['CLASSES'])
    if meta.get('PALETTE') is not None:
        out['palette'] = [tuple(int(c) for c in color)
                          for color in meta['PALETTE']]
    return out


def convert_published(checkpoint: Mapping) -> Tuple[Dict, List[str]]:
    """A published detector / segmentor checkpoint in our layout.

    Returns ``{'meta': ..., 'state_dict': ...}`` (``meta['dataset_meta']``
    holds the published class names and palette) and the list of what was
    changed, one line each, for the log.
    """
    meta = dict(checkpoint.get('meta') or {})
    source = toolkit_of(meta) or 'published layout'
    log = []
    state_dict = {}
    renamed = {src: 0 for src, _ in RENAMED}
    for key, value in without_module_prefix(
            checkpoint['state_dict']).items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(
                f'The published checkpoint holds a non-tensor entry {key!r} '
                f'({type(value).__name__}) in its state_dict.')
        for src, dst in RENAMED:
            if key.startswith(src):
                renamed[src] += 1
                key = dst + key[len(src):]
        state_dict[key] = value
    for (src, dst), n in zip(RENAMED, renamed.values()):
        if n:
            log.append(f'renamed {src}* -> {dst}* ({n} tensors)')
    dropped = [k for k in TRAINING_STATE if k in checkpoint]
    if dropped:
        log.append(f'dropped the {source} training state: '
                   f'{", ".join(dropped)} (no optimizer state of ours)')
    dataset_meta = dataset_meta_of(meta)
    if dataset_meta:
        log.append('class names' + (' and palette' if 'palette' in
                                    dataset_meta else '') +
                   " of meta['CLASSES'/'PALETTE'] kept as "
                   "meta['dataset_meta']")
    new_meta = {k: v for k, v in meta.items()
                if k not in ('CLASSES', 'PALETTE', 'config')}
    new_meta['dataset_meta'] = dataset_meta
    new_meta['converted_from'] = source
    return dict(meta=new_meta, state_dict=state_dict), log


def check_model_weights(state_dict: Mapping[str, torch.Tensor],
                        model_state: Mapping[str, torch.Tensor],
                        allow_new_classes: bool = False
                        ) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """Compare a whole-model state dict with the model's, strictly.

    With ``allow_new_classes`` (fine-tuning), the class-dependent output
    layers (:data:`CLASS_LAYERS`) may differ in shape; they are left out of
    the returned weights and named in the second return value, so that the
    model keeps them freshly initialised. Anything else that does not match
    raises :class:`CheckpointError` naming the keys.
    """
    missing = [k for k in model_state if k not in state_dict
               and not k.endswith('num_batches_tracked')]
    unexpected = [k for k in state_dict if k not in model_state]
    shapes, reinit = [], []
    for key, value in state_dict.items():
        if key in model_state and model_state[key].shape != value.shape:
            if allow_new_classes and CLASS_LAYERS.match(key):
                reinit.append(key)
            else:
                shapes.append(f'{key}: checkpoint {tuple(value.shape)} vs '
                              f'model {tuple(model_state[key].shape)}')
    if missing or unexpected or shapes:
        raise CheckpointError(mismatch_paragraph(
            'The checkpoint does not fit the model of the config:',
            [('missing weights', missing), ('unexpected keys', unexpected),
             ('shape mismatches', shapes)],
            _levels_advice(unexpected, model_state) or
            'Check that the config matches the checkpoint (backbone arch '
            'and patch size, neck and head channels, number of classes).'))
    return {k: v for k, v in state_dict.items() if k not in reinit}, reinit


def _levels_advice(unexpected: List[str],
                   model_state: Mapping[str, torch.Tensor]) -> Optional[str]:
    """What to do with a checkpoint whose backbone returns pyramid levels
    that the model's backbone does not (``out_levels``): its neck and heads
    were built for those levels too, but its backbone fits; ``None`` where
    that is not the mismatch."""
    levels = sorted(_pyramid_levels(unexpected) -
                    _pyramid_levels(model_state))
    if not levels:
        return None
    return (f'The checkpoint\'s backbone returns pyramid level'
            f'{"s" if len(levels) > 1 else ""} '
            f'{", ".join(map(str, levels))}, which this model\'s backbone '
            'does not (out_levels), so its neck and heads do not fit this '
            "model's. To start from its backbone alone, give the backbone "
            "init_cfg=dict(type='Pretrained', checkpoint=FILE, "
            "prefix='backbone.') instead of load_from: the levels not "
            'returned are left out.')


#: a key of the backbone's resampler of pyramid level N - 1 (``fpnN``)
_LEVEL_KEY = re.compile(r'^backbone\.fpn([1-4])\.')


def _pyramid_levels(keys) -> set:
    """The pyramid levels whose resamplers ``keys`` hold."""
    return {int(m.group(1)) - 1 for m in map(_LEVEL_KEY.match, keys) if m}


def refuse_resume(source: str) -> None:
    """The rule for resuming from a published checkpoint: refused, it holds
    no optimizer or scheduler state of this toolkit (raises
    :class:`CheckpointError`)."""
    raise CheckpointError(
        f'Cannot resume from {source}: it is a published XCiT checkpoint '
        '(mmdet 2 / mmseg 0 layout) with no optimizer or scheduler state of '
        'this toolkit. Fine-tune from it with load_from=FILE (e.g. '
        '--cfg-options load_from=FILE, no --resume) or evaluate it with '
        'tools/test.py.')


def model_weights(checkpoint: Mapping, model_state: Mapping,
                  allow_new_classes: bool = False, log=print
                  ) -> Tuple[Mapping, Dict[str, torch.Tensor], List[str]]:
    """A whole detector / segmentor checkpoint (ours, or published and
    converted in memory, each change logged) checked strictly against
    ``model_state`` (see :func:`check_model_weights`). Returns the
    checkpoint in our layout, the weights to load and the class layers
    left freshly initialised."""
    if is_published(checkpoint):
        checkpoint, changes = convert_published(checkpoint)
        log('Converted a published XCiT checkpoint to the mmdet 3 / mmseg 1 '
            'layout: ' + '; '.join(changes) + '.')
    if not isinstance(checkpoint, Mapping):
        raise CheckpointError('Not a checkpoint of a model: '
                              f'{type(checkpoint).__name__}.')
    state_dict = without_module_prefix(checkpoint.get('state_dict',
                                                      checkpoint))
    weights, reinit = check_model_weights(state_dict, model_state,
                                          allow_new_classes)
    return checkpoint, weights, reinit


def load_model_checkpoint(model: torch.nn.Module, path: str,
                          logger=None) -> Dict:
    """Load a whole detector / segmentor checkpoint (ours or published, a
    file or URL) into ``model`` strictly, in memory; return its class names
    and palette (``{}`` if it has none).

    For code that builds a model without mmengine's Runner (the demo);
    the Runner does the same through
    :class:`xcit_dense.hooks.CheckpointImportHook`.
    """
    from .files import read_checkpoint
    checkpoint, weights, _ = model_weights(
        read_checkpoint(path), model.state_dict(),
        log=logger.info if logger is not None else print)
    model.load_state_dict(weights, strict=False)
    return dataset_meta_of(checkpoint.get('meta') or {})
