"""Data checks for segmentation pipelines (no mmseg import needed)."""
import numpy as np
from mmcv.transforms import BaseTransform

from .errors import DataError
from .registry import TRANSFORMS


@TRANSFORMS.register_module()
class CheckSegLabels(BaseTransform):
    """Fail with the file's name on label values beyond the class count.

    Put it right after ``LoadAnnotations``. Without it, such values reach the
    loss as out-of-range targets and fail far from their cause.

    Args:
        num_classes (int): Number of classes of the dataset.
        ignore_index (int): The ignored label value. Defaults to 255.
    """

    def __init__(self, num_classes: int, ignore_index: int = 255):
        self.num_classes = num_classes
        self.ignore_index = ignore_index

    def transform(self, results: dict) -> dict:
        if 'gt_seg_map' not in results:  # inference: no label map to check
            return results
        seg = results['gt_seg_map']
        bad = (seg >= self.num_classes) & (seg != self.ignore_index)
        if bad.any():
            values = np.unique(seg[bad])
            reduced = results.get('reduce_zero_label', False)
            in_file = values + 1 if reduced else values
            allowed = (f'0 (ignore) and 1..{self.num_classes}' if reduced
                       else f'0..{self.num_classes - 1} and '
                       f'{self.ignore_index} (ignore)')
            raise DataError(
                f'{results.get("seg_map_path")}: label values '
                f'{in_file.tolist()} beyond the {self.num_classes} classes '
                f'of the dataset; allowed: {allowed}.')
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(num_classes={self.num_classes}, '
                f'ignore_index={self.ignore_index})')
