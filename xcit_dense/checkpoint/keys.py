"""What every checkpoint loader shares: the published code's names of our
weights, DDP's ``module.`` prefix removed, and the paragraph a strict
comparison ends with when keys do not match."""
from typing import Dict, List, Mapping, Sequence, Tuple

#: keys named in a mismatch paragraph before "... (+N more)"
SHOWN_KEYS = 12

#: the published code's names of backbone weights that differ from ours
#: (facebookresearch/xcit: its ImageNet checkpoints and its detection and
#: segmentation backbone call the positional encoder ``pos_embeder``); a
#: state dict with them loads as one with ours
PUBLISHED_NAMES = (('pos_embeder.', 'pos_embed.'), )


def read_published_names(module, state_dict: Dict, prefix: str,
                         *args) -> None:
    """A ``load_state_dict`` pre-hook (``module`` and the hook's other
    arguments unused): renames in place the keys under ``prefix`` that carry
    the published code's names (:data:`PUBLISHED_NAMES`) to ours, where ours
    are not there too."""
    for old, new in PUBLISHED_NAMES:
        for key in [k for k in state_dict if k.startswith(prefix + old)]:
            ours = prefix + new + key[len(prefix + old):]
            if ours not in state_dict:
                state_dict[ours] = state_dict.pop(key)


def without_module_prefix(state_dict: Mapping) -> Dict:
    """``state_dict`` with the ``module.`` prefix of DDP-wrapped models
    removed from its keys."""
    return {k[len('module.'):] if k.startswith('module.') else k: v
            for k, v in state_dict.items()}


def short(keys: List[str], n: int = SHOWN_KEYS) -> str:
    """The first ``n`` keys, then how many more."""
    return ', '.join(keys[:n]) + (f', ... (+{len(keys) - n} more)'
                                  if len(keys) > n else '')


def mismatch_paragraph(title: str,
                       groups: Sequence[Tuple[str, List[str]]],
                       advice: str) -> str:
    """``title``, one line per non-empty group of keys (``'missing
    weights'``, ``'unexpected keys'``, ``'shape mismatches'``, ...) and the
    ``advice`` on what to check."""
    lines = [title]
    lines += [f'  {what} ({len(keys)}): {short(keys)}'
              for what, keys in groups if keys]
    lines.append(f'  {advice}')
    return '\n'.join(lines)
