"""Import image-classification checkpoints into the XCiT backbone.

Accepted sources:

* official facebookresearch/xcit ImageNet checkpoints: weights under
  ``'model'``, positional encoder named ``pos_embeder``;
* timm weights (``.pth``, ``.bin`` or ``.safetensors``), a flat state dict with
  the positional encoder named ``pos_embed``;
* DINO self-supervised XCiT checkpoints: full training files with
  ``'teacher'`` / ``'student'`` (keys prefixed ``module.`` and/or
  ``backbone.``), or the released backbone-only weights;
* backbones written by ``tools/convert_checkpoint.py`` and whole detectors or
  segmentors trained with this package (``'state_dict'`` with a
  ``backbone.`` prefix).

The conversion functions are pure (state dict in, state dict out); loading
is strict: classification-only weights are dropped and listed, every
backbone weight must be present with the right shape, and the pyramid is
either loaded whole or, when the file has none of it (a classification
checkpoint), left freshly initialised. Files are read by
:func:`~.files.read_checkpoint` (no arbitrary unpickling; URLs downloaded
once).
"""
import logging
import re
from typing import Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn as nn

from ..errors import CheckpointError
from .files import read_checkpoint
from .keys import PUBLISHED_NAMES, mismatch_paragraph, without_module_prefix

# Top-level weights of the classification model that the backbone does not
# have: class token(s), class-attention blocks, final norm, heads.
CLASSIFICATION_ONLY = ('cls_token', 'dist_token', 'cls_attn_blocks.',
                       'norm.', 'head.', 'head_dist.', 'fc_norm.')
PYRAMID_PREFIX = re.compile(r'^fpn\d+\.')
#: the stem's first convolution, the one weight that sees the images
FIRST_CONV = 'patch_embed.proj.0.0.weight'
def extract_state_dict(checkpoint: Mapping,
                       checkpoint_key: Optional[str] = None
                       ) -> Tuple[Dict[str, torch.Tensor], str]:
    """Pick the weights out of a checkpoint and name its format.

    Returns the (unconverted) state dict and one of ``'xcit-dense'``,
    ``'official'``, ``'dino'`` or ``'flat (timm)'``.
    """
    if not isinstance(checkpoint, Mapping):
        raise CheckpointError(
            f'A checkpoint must be a dict of weights, got '
            f'{type(checkpoint).__name__}')
    if checkpoint_key is not None:
        if checkpoint_key not in checkpoint:
            raise CheckpointError(
                f'checkpoint_key {checkpoint_key!r} not in the checkpoint; '
                f'its top-level keys: {sorted(map(str, checkpoint))[:20]}')
        fmt = 'dino' if checkpoint_key in ('teacher', 'student') else \
            'official' if checkpoint_key in ('model', 'model_ema') else \
            'xcit-dense'
        state_dict = checkpoint[checkpoint_key]
    elif 'state_dict' in checkpoint:
        state_dict, fmt = checkpoint['state_dict'], 'xcit-dense'
    elif 'model' in checkpoint:
        state_dict, fmt = checkpoint['model'], 'official'
    elif 'teacher' in checkpoint:
        state_dict, fmt = checkpoint['teacher'], 'dino'
    elif 'student' in checkpoint:
        state_dict, fmt = checkpoint['student'], 'dino'
    else:
        state_dict, fmt = checkpoint, 'flat (timm)'
    if not isinstance(state_dict, Mapping):
        raise CheckpointError(
            f'The weights of a {fmt} checkpoint must be a dict, got '
            f'{type(state_dict).__name__}')
    bad = [k for k, v in state_dict.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(
            f'Entries that are not tensors in the {fmt} state dict: '
            f'{bad[:10]}{" ..." if len(bad) > 10 else ""}')
    return dict(state_dict), fmt


def convert_state_dict(state_dict: Mapping[str, torch.Tensor]
                       ) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """Map a classification / DINO / detector state dict onto backbone names.

    Strips the ``module.`` (DDP) and ``backbone.`` (DINO, detectors)
    prefixes, renames the official ``pos_embeder`` to ``pos_embed``
    (:data:`.keys.PUBLISHED_NAMES`) and drops what the
    backbone has no use for.

    Returns:
        The converted state dict, and the dropped keys with the reason.
    """
    dropped: Dict[str, str] = {}
    items = list(without_module_prefix(state_dict).items())
    if any(k.startswith('backbone.') for k, _ in items):
        kept = []
        for k, v in items:
            if k.startswith('backbone.'):
                kept.append((k[len('backbone.'):], v))
            else:
                dropped[k] = 'not part of the backbone'
        items = kept
    converted: Dict[str, torch.Tensor] = {}
    for k, v in items:
        for old, new in PUBLISHED_NAMES:
            if k.startswith(old):
                k = new + k[len(old):]
        if k.startswith(CLASSIFICATION_ONLY):
            dropped[k] = 'classification only'
            continue
        converted[k] = v
    return converted, dropped


def infer_settings(state_dict) -> dict:
    """Patch size, width, depth and heads of a converted state dict."""
    try:
        convs = {int(m.group(1)) for k in state_dict
                 if (m := re.match(r'patch_embed\.proj\.(\d+)\.0\.weight', k))}
        blocks = {int(m.group(1)) for k in state_dict
                  if (m := re.match(r'blocks\.(\d+)\.', k))}
        return dict(
            patch_size=2**len(convs),
            embed_dim=state_dict['blocks.0.norm1.weight'].shape[0],
            depth=max(blocks) + 1,
            num_heads=state_dict['blocks.0.attn.temperature'].shape[0])
    except (KeyError, ValueError) as e:
        raise CheckpointError(
            f'Not an XCiT checkpoint: cannot find the patch embedding and '
            f'blocks ({type(e).__name__}: {e})') from e


def match_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor]
                     ) -> Tuple[Dict[str, torch.Tensor], Dict[str, str],
                                List[str]]:
    """Check a converted state dict against the backbone, strictly.

    Returns the weights to load, the checkpoint keys not loaded with the
    reason (blocks after the last tapped one, resamplers of levels not
    returned), and the pyramid keys left
    freshly initialised. Raises :class:`CheckpointError` naming the keys on
    any missing backbone weight, unknown key or shape mismatch.
    """
    own = model.state_dict()
    to_load, unused, unexpected, problems = _sorted_keys(model, own,
                                                         state_dict)
    missing = [k for k in own if k not in state_dict
               and not k.endswith('num_batches_tracked')]
    pyramid_missing = [k for k in missing if PYRAMID_PREFIX.match(k)]
    pyramid_own = [k for k in own if PYRAMID_PREFIX.match(k)
                   and not k.endswith('num_batches_tracked')]
    fresh: List[str] = []
    if pyramid_missing and len(pyramid_missing) == len(pyramid_own):
        fresh = pyramid_missing  # classification checkpoint: no pyramid
    missing = [k for k in missing if k not in fresh]

    if missing or unexpected or problems:
        raise CheckpointError(mismatch_paragraph(
            'The checkpoint does not fit the XCiT backbone '
            f'(arch {getattr(model, "arch", None)!r}, '
            f'{getattr(model, "arch_settings", {})}):',
            [('missing backbone weights', missing),
             ('unexpected keys', unexpected),
             ('shape mismatches', problems)],
            _advice(model, missing, unexpected, problems)))
    return to_load, unused, fresh


def _sorted_keys(model: nn.Module, own: Mapping[str, torch.Tensor],
                 state_dict: Mapping[str, torch.Tensor]
                 ) -> Tuple[Dict[str, torch.Tensor], Dict[str, str],
                            List[str], List[str]]:
    """The checkpoint's keys sorted: the weights to load, those not loaded
    with the reason (blocks after the last tapped one, resamplers of levels
    not returned), the unexpected keys and the shape mismatches."""
    depth = getattr(model, 'depth', None)
    n_built = len(model.blocks)
    to_load, unused, unexpected, problems = {}, {}, [], []
    for k, v in state_dict.items():
        if k in own:
            if own[k].shape != v.shape:
                problems.append(f'{k}: checkpoint {tuple(v.shape)} vs '
                                f'model {tuple(own[k].shape)}')
            else:
                to_load[k] = v
            continue
        m = re.match(r'^blocks\.(\d+)\.', k)
        level = re.match(r'^fpn([1-4])\.', k)
        if m and depth is not None and n_built <= int(m.group(1)) < depth:
            unused[k] = 'after the last tapped block'
        elif level and not hasattr(model, f'fpn{level.group(1)}'):
            unused[k] = 'a pyramid level not returned (out_levels)'
        else:
            unexpected.append(k)
    return to_load, unused, unexpected, problems


def _advice(model: nn.Module, missing: List[str], unexpected: List[str],
            problems: List[str]) -> str:
    """What to do about a checkpoint that does not fit: keep the preset's
    depth where the checkpoint is deeper than the backbone (its later
    blocks alone unexpected), else check the preset."""
    blocks = [re.match(r'^blocks\.(\d+)\.', k) for k in unexpected]
    deeper = {int(m.group(1)) for m in blocks if m}
    if deeper and all(blocks) and not missing and not problems and \
            min(deeper) >= len(model.blocks):
        return (f'The checkpoint has {max(deeper) + 1} blocks, this '
                f'backbone depth {getattr(model, "depth", None)}: to use its '
                f'first blocks, keep depth={max(deeper) + 1} (the preset\'s) '
                'and tap earlier blocks with out_indices; blocks after the '
                'last tap are not built and their weights are dropped.')
    return ('Check that the arch (or embed_dim, depth, num_heads, '
            'patch_size) matches the checkpoint.')


def _group(keys) -> List[str]:
    """Summarise keys by their first two name parts, for logs."""
    groups: Dict[str, int] = {}
    for k in keys:
        head = '.'.join(k.split('.')[:2]) if k.split('.')[0] in (
            'blocks', 'cls_attn_blocks') else k.split('.')[0]
        groups[head] = groups.get(head, 0) + 1
    return [f'{g} ({n})' if n > 1 else g for g, n in groups.items()]


def under_prefix(state_dict: Mapping[str, torch.Tensor], prefix: str
                 ) -> Dict[str, torch.Tensor]:
    """The weights whose names begin with ``prefix``, without it, as
    mmengine's ``Pretrained`` initialisation selects them (a missing final
    dot added: ``'backbone'`` is ``'backbone.'``)."""
    if not prefix.endswith('.'):
        prefix += '.'
    selected = {k[len(prefix):]: v for k, v in state_dict.items()
                if k.startswith(prefix)}
    if not selected:
        heads = sorted({k.split('.')[0] + '.' for k in state_dict})
        raise CheckpointError(
            f'No weights under the prefix {prefix!r}: the checkpoint\'s '
            f'names begin with {", ".join(heads[:12])}'
            f'{" ..." if len(heads) > 12 else ""}')
    return selected


def adapt_input_channels(model: nn.Module,
                         state_dict: Dict[str, torch.Tensor]
                         ) -> Optional[str]:
    """Where the backbone takes images of another number of channels than
    the checkpoint's (``in_channels=1`` or 4 from an RGB checkpoint), the
    stem's first convolution adapted in ``state_dict`` as timm adapts it
    (``adapt_input_conv``: summed over the channels for one, repeated and
    scaled for more); what was done, or None."""
    weight = state_dict.get(FIRST_CONV)
    own = model.state_dict().get(FIRST_CONV)
    if weight is None or own is None or weight.dim() != 4 or \
            weight.shape[1] == own.shape[1] or \
            weight.shape[:1] + weight.shape[2:] != own.shape[:1] + \
            own.shape[2:]:
        return None
    from timm.models._manipulate import adapt_input_conv
    state_dict[FIRST_CONV] = adapt_input_conv(own.shape[1], weight,
                                              base_chans=weight.shape[1])
    how = 'summed over its' if own.shape[1] == 1 else 'repeated from its'
    return (f"The stem's first convolution takes {own.shape[1]} image "
            f'channel{"s" if own.shape[1] != 1 else ""}: its checkpoint '
            f"weight is {how} {weight.shape[1]} (timm's adapt_input_conv).")


def backbone_weights(model: nn.Module, checkpoint: Mapping,
                     checkpoint_key: Optional[str] = None,
                     prefix: Optional[str] = None
                     ) -> Tuple[Dict[str, torch.Tensor], Dict[str, str],
                                List[str], str, Optional[str]]:
    """What :func:`load_backbone_checkpoint` loads from a checkpoint's
    contents into ``model`` (checked strictly against its names and
    shapes; a model on the meta device will do): the weights, the entries
    dropped (key -> reason), the pyramid keys left fresh, the format, and
    how the first convolution was adapted to the model's input channels
    (:func:`adapt_input_channels`) or None."""
    state_dict, fmt = extract_state_dict(checkpoint, checkpoint_key)
    if prefix:
        state_dict = under_prefix(state_dict, prefix)
    converted, dropped = convert_state_dict(state_dict)
    adapted = adapt_input_channels(model, converted)
    to_load, unused, fresh = match_state_dict(model, converted)
    dropped.update(unused)
    return to_load, dropped, fresh, fmt, adapted


def load_backbone_checkpoint(model: nn.Module,
                             path: str,
                             checkpoint_key: Optional[str] = None,
                             logger: Optional[logging.Logger] = None,
                             prefix: Optional[str] = None,
                             map_location: object = None) -> dict:
    """Import the checkpoint at ``path`` into an :class:`XCiT` backbone;
    with ``prefix``, only its weights under that prefix (:func:`under_prefix`:
    ``'teacher.backbone.'`` of a Mean Teacher detector, say).
    ``map_location`` is accepted as mmengine's ``Pretrained`` takes it: the
    file is read onto the CPU and its values copied into the backbone's
    parameters, wherever they are.

    Returns a report: ``format``, ``loaded``, ``dropped`` (key -> reason),
    ``fresh`` (pyramid keys initialised afresh), ``adapted`` (how the first
    convolution was adapted to ``in_channels``, or None).
    """
    log = logger.info if logger is not None else (lambda msg: None)
    to_load, dropped, fresh, fmt, adapted = backbone_weights(
        model, read_checkpoint(path), checkpoint_key, prefix)
    result = model.load_state_dict(to_load, strict=False)
    # Every key was checked above; the only keys load_state_dict may report
    # missing are the freshly initialised pyramid and BN step counters.
    leftover = [k for k in result.missing_keys
                if k not in fresh and not k.endswith('num_batches_tracked')]
    assert not leftover and not result.unexpected_keys, (leftover, result)
    log(f'Loaded {len(to_load)} backbone weights from {path} '
        f'({fmt} checkpoint).')
    if adapted:
        log(adapted)
    if dropped:
        log(f'Dropped {len(dropped)} checkpoint entries not used by the '
            f'backbone: {", ".join(_group(dropped))}.')
    if fresh:
        log(f'The checkpoint has no pyramid weights; {len(fresh)} pyramid '
            f'parameters are freshly initialised: {", ".join(_group(fresh))}.')
    return dict(format=fmt, loaded=sorted(to_load), dropped=dropped,
                fresh=fresh, adapted=adapted)
