"""FLOPs and parameters of a detector or segmentor, counted as mmdet's and
mmseg's ``tools/analysis_tools/get_flops.py`` count them
(``tools/get_flops.py``).

mmengine's counter (:class:`mmengine.analysis.FlopAnalyzer`) traces the
model's ``'tensor'``-mode forward on preprocessed inputs with
``torch.jit`` and counts one multiply-add as one FLOP, as mmdet's and
mmseg's tables do. A trace takes none of the backbone's
fast paths (:func:`xcit_dense.models.policy.applies`), so what is counted
is the published design's arithmetic, the same for every setting of
``fast_path``. Element-wise operators (activations, additions,
normalisation's arithmetic) are not counted, by the counter's design; they
are listed."""
import inspect
from dataclasses import dataclass
from typing import Counter, Sequence

import torch
import torch.nn as nn


class TensorForward(nn.Module):
    """``model``'s forward in mmdet's and mmseg's ``'tensor'`` mode on the
    preprocessed inputs, with ``data_samples`` bound (what mmdet's
    ``get_flops.py`` traces). A segmentor whose decode head needs the data
    samples (mmseg's Mask2Former and MaskFormer heads, which mmseg's
    ``'tensor'`` mode calls without them) runs its backbone, neck and head
    as its ``predict`` does, up to the head's outputs."""

    def __init__(self, model: nn.Module, data_samples: Sequence) -> None:
        super().__init__()
        self.model = model
        self.data_samples = list(data_samples)
        head = getattr(model, 'decode_head', None)
        self.head_takes_samples = head is not None and \
            'batch_data_samples' in inspect.signature(head.forward).parameters

    def forward(self, inputs: torch.Tensor):
        if self.head_takes_samples:
            return self.model.decode_head(self.model.extract_feat(inputs),
                                          self.data_samples)
        return self.model(inputs, self.data_samples, mode='tensor')


@dataclass
class Complexity:
    """What :func:`count` found: FLOPs (multiply-adds) and parameters of the
    whole model and of its backbone, and the operators traced but not
    counted, with how often each ran."""
    flops: int
    params: int
    backbone_flops: int
    backbone_params: int
    uncounted: Counter[str]


def count(model: nn.Module, inputs: torch.Tensor,
          data_samples: Sequence) -> Complexity:
    """Count ``model`` (a detector or segmentor, in eval mode) on one batch
    of preprocessed ``inputs`` (see :class:`TensorForward`)."""
    from mmengine.analysis import FlopAnalyzer, parameter_count
    traced = TensorForward(model, data_samples)
    with torch.no_grad():
        flops = FlopAnalyzer(traced, inputs)
        flops.unsupported_ops_warnings(False)
        flops.uncalled_modules_warnings(False)
        flops.tracer_warnings('none')
        total = flops.total()
    by_module = flops.by_module()
    params = parameter_count(model)
    return Complexity(flops=total, params=params[''],
                      backbone_flops=by_module.get('model.backbone', 0),
                      backbone_params=params.get('backbone', 0),
                      uncounted=flops.unsupported_ops())
