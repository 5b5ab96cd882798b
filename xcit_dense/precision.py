"""Low-precision inference of chosen parts of a model, the rest in fp32.

mmengine's ``TestLoop(fp16=True)`` runs the whole ``predict`` under
``torch.autocast``: on a CPU that is bf16 for everything, box decoding
included, and bf16 keeps 8 bits of mantissa, so a box corner near x = 800
moves in steps of 4 pixels. :class:`AutocastPartsHook` instead runs only the
named parts (the networks: backbone, neck, heads) under autocast and hands
their outputs on in fp32, so that what lies between them (anchor and box
decoding, NMS, RoIAlign, mask pasting) computes in fp32 as it always does.
"""
from typing import Dict, List, Sequence

import torch
import torch.nn as nn
from mmengine.hooks import Hook

from .errors import UserError
from .registry import HOOKS

#: the networks of mmdet's Mask R-CNN family
DETECTOR_PARTS = ('backbone', 'neck', 'rpn_head', 'roi_head.bbox_head',
                  'roi_head.mask_head')


def to_float(value):
    """Floating-point tensors in ``value`` (and in its tuples, lists and
    dicts) as fp32."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        items = [to_float(v) for v in value]
        return type(value)(items) if isinstance(value, list) else \
            tuple(items)
    if isinstance(value, dict):
        return {k: to_float(v) for k, v in value.items()}
    return value


def autocast_part(module: nn.Module, dtype: torch.dtype) -> List:
    """Run ``module``'s forward under ``torch.autocast`` of its device with
    ``dtype``, its outputs cast to fp32, through forward hooks (its own
    ``forward`` runs as written). Returns the hook handles."""
    def enter(mod, args):
        device = next(mod.parameters(), torch.empty(0)).device.type
        mod.__dict__.setdefault('_autocast_contexts', []).append(
            torch.autocast(device, dtype=dtype))
        mod._autocast_contexts[-1].__enter__()

    def leave(mod, args, output):
        mod._autocast_contexts.pop().__exit__(None, None, None)
        return to_float(output)
    return [module.register_forward_pre_hook(enter),
            module.register_forward_hook(leave, always_call=True)]


@HOOKS.register_module()
class AutocastPartsHook(Hook):
    """In validation and testing, run ``parts`` of the model (dotted module
    names) in ``dtype`` under ``torch.autocast``, each part's outputs cast
    back to fp32; training is left as it is. In a config::

        custom_hooks = [dict(type='xcit_dense.AutocastPartsHook',
                             dtype='bfloat16')]

    Args:
        dtype (str): ``'bfloat16'`` (CPUs with AVX-512 BF16 or AMX, GPUs)
            or ``'float16'`` (GPUs).
        parts (sequence of str): the modules to run in ``dtype``; default
            the networks of Mask R-CNN (:data:`DETECTOR_PARTS`).
    """
    priority = 'NORMAL'

    def __init__(self, dtype: str = 'bfloat16',
                 parts: Sequence[str] = DETECTOR_PARTS):
        if dtype not in ('bfloat16', 'float16'):
            raise UserError(f"AutocastPartsHook's dtype must be 'bfloat16' "
                            f"or 'float16', got {dtype!r}.")
        self.dtype = getattr(torch, dtype)
        self.parts = tuple(parts)
        self._handles: List = []

    def modules(self, model: nn.Module) -> Dict[str, nn.Module]:
        """The parts by name; an unknown name is a :class:`UserError`."""
        while hasattr(model, 'module'):  # DDP, test-time augmentation
            model = model.module
        names = dict(model.named_modules())
        missing = [p for p in self.parts if p not in names]
        if missing:
            raise UserError(
                f'AutocastPartsHook: the model has no {", ".join(missing)}; '
                'parts must name its modules (for example '
                f'{", ".join(DETECTOR_PARTS)}).')
        return {p: names[p] for p in self.parts}

    def _start(self, runner) -> None:
        for module in self.modules(runner.model).values():
            self._handles += autocast_part(module, self.dtype)
        runner.logger.info(
            f'{", ".join(self.parts)} run in {str(self.dtype)[6:]} '
            '(torch.autocast), their outputs and everything between them in '
            'float32')

    def _stop(self, runner, *args, **kwargs) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def before_val(self, runner) -> None:
        self._start(runner)

    def before_test(self, runner) -> None:
        self._start(runner)

    after_val = _stop
    after_test = _stop
