"""Mask2Former's pixel decoder in fp32 under mixed precision, as its
published code runs it.

Mask2Former's published pixel decoder (facebookresearch/Mask2Former,
``MSDeformAttnPixelDecoder.forward_features``) runs under
``autocast(enabled=False)`` with its input features cast to fp32 ("deformable
detr does not support half precision"). mmdet's ``MSDeformAttnPixelDecoder``
(Mask2Former's in mmdet and mmseg) has no such guard: under AMP its
projections, deformable-attention encoder and FPN run in fp16, mmcv's CUDA
multi-scale deformable attention kernel among them, which computes in its
inputs' dtype throughout (sampling positions, bilinear weights, sums, and
gradients accumulated by ``atomicAdd``).
:class:`Float32MSDeformAttnPixelDecoder` runs it as the published code
does; the recipes' matcher is likewise in fp32 (:mod:`.matching`).

Registered in the ``xcit_dense`` scope when this module is imported (the
Mask2Former recipes list it in ``custom_imports``), not with the backbone:
it imports mmdet's models, which a backbone alone does not need.
"""
from typing import List, Tuple

import torch
from mmdet.models.layers import MSDeformAttnPixelDecoder

from .precision import to_float
from .registry import MODELS


@MODELS.register_module()
class Float32MSDeformAttnPixelDecoder(MSDeformAttnPixelDecoder):
    """mmdet's ``MSDeformAttnPixelDecoder`` (the same arguments, weights and
    checkpoint keys), run with autocast off and its input features in fp32,
    so that its outputs are fp32 under AMP, as Mask2Former's published
    pixel decoder runs. Without autocast it is mmdet's, bit for bit."""

    def forward(self, feats: List[torch.Tensor]
                ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        with torch.autocast(feats[0].device.type, enabled=False):
            return super().forward(to_float(list(feats)))
