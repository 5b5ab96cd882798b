"""The norms of the stem, the local patch interaction and the pyramid,
built from the backbone's ``norm_cfg``."""
import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer

from ..errors import first_line


def norm_layer(norm_cfg: dict, channels: int) -> nn.Module:
    """mmcv's ``build_norm_layer(norm_cfg, channels)`` module, checked to
    normalise (B, ``channels``, H, W) maps (once, in eval mode, on a map of
    zeros); a config that does not build or does not normalise such maps is
    one paragraph."""
    try:
        norm = build_norm_layer(norm_cfg, channels)[1]
        with torch.no_grad():
            norm.eval()(torch.zeros(1, channels, 2, 2))
        norm.train()
    except Exception as error:
        raise ValueError(
            f"norm_cfg={dict(norm_cfg)!r} does not normalise the backbone's "
            f'{channels}-channel maps ({first_line(error)}). The stem, the '
            f'local patch interaction and the pyramid normalise NCHW maps: '
            f"norm_cfg takes mmcv's norms of such maps, dict(type='BN') (the "
            f"published models'), 'SyncBN', 'IN', or 'GN' with a num_groups "
            f"that divides every width (the stem's are embed_dim / 8, / 4 "
            f'and / 2 for patch 16).') from error
    return norm
