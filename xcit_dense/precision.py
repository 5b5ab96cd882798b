"""Chosen parts of a model in another precision than the rest: in low
precision for inference (:class:`AutocastPartsHook`), or in fp32 under
mixed precision (:class:`Float32PartsHook`).

mmengine's ``TestLoop(fp16=True)`` runs the whole ``predict`` under
``torch.autocast``: on a CPU that is bf16 for everything, box decoding
included, and bf16 keeps 8 bits of mantissa, so a box corner near x = 800
moves in steps of 4 pixels. :class:`AutocastPartsHook` instead runs only the
named parts (the networks: backbone, neck, heads) under autocast and hands
their outputs on in fp32, so that what lies between them (anchor and box
decoding, NMS, RoIAlign, mask pasting) computes in fp32 as it always does.
"""
from typing import List, Sequence

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
    ``forward`` runs as written). ``torch.float32``: autocast off inside
    it, its floating inputs cast to fp32 (under an enclosing autocast they
    may be fp16 or bf16). Returns the hook handles."""
    full = dtype == torch.float32

    def enter(mod, args, kwargs):
        device = next(mod.parameters(), torch.empty(0)).device.type
        context = (torch.autocast(device, enabled=False) if full else
                   torch.autocast(device, dtype=dtype))
        mod.__dict__.setdefault('_autocast_contexts', []).append(context)
        context.__enter__()
        return (to_float(args), to_float(kwargs)) if full else None

    def leave(mod, args, output):
        mod._autocast_contexts.pop().__exit__(None, None, None)
        return to_float(output)
    return [module.register_forward_pre_hook(enter, with_kwargs=True),
            module.register_forward_hook(leave, always_call=True)]


class PartsHook(Hook):
    """While started, the named ``parts`` of the model (dotted module names,
    below any wrapper) run in ``dtype`` through :func:`autocast_part`;
    subclasses say when, and what the log says (:meth:`running`)."""
    priority = 'NORMAL'

    def __init__(self, dtype: torch.dtype, parts: Sequence[str]):
        self.dtype = dtype
        self.parts = tuple(parts)
        self._handles: List = []

    def running(self) -> str:
        """How the parts run, for the log."""
        raise NotImplementedError

    def _start(self, runner) -> None:
        """Hook the parts; an unknown name is a :class:`UserError`."""
        model = runner.model
        while hasattr(model, 'module'):  # DDP, test-time augmentation
            model = model.module
        names = dict(model.named_modules())
        missing = [p for p in self.parts if p not in names]
        if missing:
            raise UserError(
                f'{type(self).__name__}: the model has no '
                f'{", ".join(missing)}; parts must name its modules (for '
                f'example {", ".join(DETECTOR_PARTS)}).')
        for part in self.parts:
            self._handles += autocast_part(names[part], self.dtype)
        runner.logger.info(f'{", ".join(self.parts)} run in '
                           f'{self.running()}')

    def _stop(self, runner, *args, **kwargs) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


@HOOKS.register_module()
class AutocastPartsHook(PartsHook):
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
    def __init__(self, dtype: str = 'bfloat16',
                 parts: Sequence[str] = DETECTOR_PARTS):
        if dtype not in ('bfloat16', 'float16'):
            raise UserError(f"AutocastPartsHook's dtype must be 'bfloat16' "
                            f"or 'float16', got {dtype!r}.")
        super().__init__(getattr(torch, dtype), parts)

    def running(self) -> str:
        return (f'{str(self.dtype)[6:]} (torch.autocast), their outputs and '
                'everything between them in float32')

    def before_val(self, runner) -> None:
        self._start(runner)

    def before_test(self, runner) -> None:
        self._start(runner)

    after_val = PartsHook._stop
    after_test = PartsHook._stop


@HOOKS.register_module()
class Float32PartsHook(PartsHook):
    """Run ``parts`` of the model (dotted module names) in fp32 under
    autocast, for the whole run (AMP training, fp16 validation and
    testing): autocast off inside each part, its floating inputs cast to
    fp32. Mask2Former's published code runs its pixel decoder so under AMP
    ("deformable detr does not support half precision"); mmcv's CUDA
    multi-scale deformable attention otherwise runs in fp16. Without
    autocast nothing changes. In a config::

        custom_hooks = [dict(type='xcit_dense.Float32PartsHook',
                             parts=['panoptic_head.pixel_decoder'])]

    Args:
        parts (sequence of str): the modules to run in fp32.
    """
    def __init__(self, parts: Sequence[str]):
        if isinstance(parts, str) or not parts:
            raise UserError(
                'Float32PartsHook: parts must be a list of module names '
                f"(e.g. ['panoptic_head.pixel_decoder']), got {parts!r}.")
        super().__init__(torch.float32, parts)

    def running(self) -> str:
        return 'float32 (autocast off inside them)'

    def before_run(self, runner) -> None:
        self._start(runner)

    def after_run(self, runner) -> None:
        self._stop(runner)
