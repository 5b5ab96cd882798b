"""Set-prediction matching that mixed precision cannot break.

mmdet's ``HungarianAssigner`` (Mask2Former's matcher, in mmdet and mmseg)
sums each query's point-wise mask costs over the sampled points with
``torch.einsum``; under ``torch.autocast`` that product runs in fp16 (the
costs' ``.float()`` does not stop autocast from casting it back), and with
the recipes' 12,544 points a background query's binary cross-entropy
against a large object (about 8 per point for a logit of -8) sums past
fp16's largest value, 65,504. The cost is then infinite; when every query
predicts background over an object, the object's column has no finite
entry and SciPy's ``linear_sum_assignment`` stops the run ("cost matrix is
infeasible"). Mask2Former's published matcher computes these costs with
autocast off, in fp32; :class:`Float32HungarianAssigner` does the same.
"""
import torch
from mmdet.models.task_modules.assigners import HungarianAssigner
from mmengine.structures import InstanceData

from .precision import to_float
from .registry import TASK_UTILS


def _in_fp32(instances: InstanceData) -> InstanceData:
    """``instances`` with its floating-point fields in fp32."""
    return instances.new(**{key: to_float(value)
                            for key, value in instances.items()})


@TASK_UTILS.register_module()
class Float32HungarianAssigner(HungarianAssigner):
    """mmdet's ``HungarianAssigner`` with its match costs computed in fp32,
    autocast off, as Mask2Former's published matcher does; the same
    arguments (``match_costs``). Without autocast its assignments are
    mmdet's, bit for bit."""

    def assign(self, pred_instances: InstanceData,
               gt_instances: InstanceData, img_meta=None, **kwargs):
        device = next((v.device.type for v in pred_instances.values()
                       if isinstance(v, torch.Tensor)), 'cpu')
        with torch.autocast(device, enabled=False):
            return super().assign(_in_fp32(pred_instances),
                                  _in_fp32(gt_instances), img_meta=img_meta,
                                  **kwargs)
