"""Models built on the meta device (shapes and names without values)."""
import contextlib
from unittest import mock

import timm.models.xcit as timm_xcit
import torch

from xcit_dense.models import backbone


def _no_draw(tensor, **_):
    return tensor


@contextlib.contextmanager
def on_meta():
    """``torch.device('meta')`` without the truncated-normal draws of our
    and timm's XCiT initialisation: on the meta device they set nothing,
    and each runs a dozen operators' Python meta functions."""
    with torch.device('meta'), \
            mock.patch.object(backbone, 'trunc_normal_', _no_draw), \
            mock.patch.object(timm_xcit, 'trunc_normal_', _no_draw):
        yield
