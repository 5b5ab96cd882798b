"""Chosen parts of a model in another precision than the rest: in low
precision for inference (:class:`AutocastPartsHook`), or in fp32 under
mixed precision (:class:`Float32PartsHook`); and where bf16 pays on the CPU
(:func:`cpu_has_native_bf16`): a bf16 autocast a config asks for runs in fp32
on a CPU that emulates bf16, saying so once (:func:`autocast_fits`).

mmengine's ``TestLoop(fp16=True)`` runs the whole ``predict`` under
``torch.autocast``: on a CPU that is bf16 for everything, box decoding
included, and bf16 keeps 8 bits of mantissa, so a box corner near x = 800
moves in steps of 4 pixels. :class:`AutocastPartsHook` instead runs only the
named parts (the networks: backbone, neck, heads) under autocast and hands
their outputs on in fp32, so that what lies between them (anchor and box
decoding, NMS, RoIAlign, mask pasting) computes in fp32 as it always does.
"""
import functools
import logging
from typing import List, Mapping, Optional, Sequence

import torch
import torch.nn as nn
from mmengine.hooks import Hook
from mmengine.logging import print_log

from .errors import UserError
from .registry import HOOKS

#: mmcv's modules whose kernels take fp32, fp64 and fp16 but not bf16 (mmcv
#: 2.1.0: ``AT_DISPATCH_FLOATING_TYPES_AND_HALF`` in their CUDA sources,
#: ``roi_align_cuda.cu``, ``ms_deform_attn_cuda.cu``,
#: ``deform_conv_cuda.cu``, ``modulated_deform_conv_cuda.cu``; their CPU
#: kernels fp32 and fp64): under bf16 autocast they run in fp32
#: (:func:`xcit_dense.runner.keep_fp32_without_bf16_kernels`)
WITHOUT_BF16_KERNELS = ('RoIAlign', 'MultiScaleDeformableAttention',
                        'DeformConv2d', 'DeformConv2dPack',
                        'ModulatedDeformConv2d', 'ModulatedDeformConv2dPack')

#: the networks of mmdet's Mask R-CNN family
DETECTOR_PARTS = ('backbone', 'neck', 'rpn_head', 'roi_head.bbox_head',
                  'roi_head.mask_head')


#: the CPU features (as ``torch.cpu.get_capabilities()`` names them) with
#: which a CPU multiplies bf16 in hardware, so that oneDNN's bf16 kernels
#: pay: x86's AVX-512 BF16 and AMX-BF16, Arm's BF16 (BFDOT, BFMMLA) and SVE
#: BF16. Without one (AVX2 alone, AVX-512 without BF16) bf16 is emulated
#: through fp32 arithmetic and conversions, at several times fp32's time.
NATIVE_BF16_FEATURES = ('avx512_bf16', 'amx_bf16', 'bf16', 'sve_bf16')

_SAID = set()  # the requests that have said they run in fp32 here


@functools.lru_cache(maxsize=None)
def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (one of
    :data:`NATIVE_BF16_FEATURES`, as PyTorch's probe finds it). Without,
    bf16 autocast costs several times fp32's time (docs/performance.md,
    "bf16 on the CPU"). True where PyTorch cannot tell: bf16 then runs as
    asked."""
    features = _cpu_features()
    return features is None or any(
        features.get(name) is True for name in NATIVE_BF16_FEATURES)


def _cpu_features() -> Optional[Mapping]:
    """The CPU's features by PyTorch's public probe
    (``torch.cpu.get_capabilities``), else by the private probes of older
    releases (AVX-512 BF16, AMX), else None."""
    probe = getattr(torch.cpu, 'get_capabilities', None)
    if probe is not None:
        return probe()
    found = {}
    for name, private in (('avx512_bf16', '_is_avx512_bf16_supported'),
                          ('amx_bf16', '_is_amx_tile_supported')):
        if hasattr(torch.cpu, private):
            found[name] = bool(getattr(torch.cpu, private)())
    return found or None


def autocast_fits(device_type: str, dtype: torch.dtype, requester: str,
                  what: str) -> bool:
    """Whether an autocast to ``dtype`` on ``device_type`` that a config
    asked for runs as asked: everywhere but bf16 on a CPU without native
    bf16 (:func:`cpu_has_native_bf16`), where ``what`` runs in fp32 instead,
    as fast as it runs there and the same computation to bf16's rounding
    (the config stays portable: on GPUs and CPUs with native bf16 it runs in
    bf16). There it says so once per ``requester``, as a warning."""
    if device_type != 'cpu' or dtype != torch.bfloat16 or \
            cpu_has_native_bf16():
        return True
    if requester not in _SAID:
        _SAID.add(requester)
        cpu = (_cpu_features() or {}).get('cpu_name') or 'this CPU'
        print_log(
            f'{requester}: {cpu} has no native bf16 (none of '
            f'{", ".join(NATIVE_BF16_FEATURES)} in '
            f'torch.cpu.get_capabilities()), where bf16 is emulated at '
            f'several times the time of fp32: running {what} in float32 '
            f'here (in bfloat16 on a GPU or a CPU with native bf16).',
            logger='current', level=logging.WARNING)
    return False


def requested_autocast(device_type: str, dtype_name: str, requester: str,
                       what: str) -> torch.autocast:
    """``torch.autocast`` of ``device_type`` to ``dtype_name``
    (``'bfloat16'``, ``'float16'``) as a config asked for it, disabled where
    it does not pay (:func:`autocast_fits`)."""
    dtype = getattr(torch, dtype_name)
    return torch.autocast(device_type, dtype=dtype, enabled=autocast_fits(
        device_type, dtype, requester, what))


def to_float(value, dtype: torch.dtype = torch.float32):
    """Floating-point tensors in ``value`` (and in its tuples, lists and
    dicts) as fp32 (or ``dtype``)."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        items = [to_float(v, dtype) for v in value]
        return type(value)(items) if isinstance(value, list) else \
            tuple(items)
    if isinstance(value, dict):
        return {k: to_float(v, dtype) for k, v in value.items()}
    return value


def autocast_part(module: nn.Module, dtype: torch.dtype,
                  in_input_dtype: bool = False) -> List:
    """Run ``module``'s forward under ``torch.autocast`` of its device with
    ``dtype``, its outputs cast to fp32, through forward hooks (its own
    ``forward`` runs as written). ``torch.float32``: autocast off inside
    it, its floating inputs cast to fp32 (under an enclosing autocast they
    may be fp16 or bf16), and with ``in_input_dtype`` its floating outputs
    cast back to the dtype of its first floating input (a kernel without
    bf16 computing in fp32 for its caller, which expects what it gave).
    Returns the hook handles."""
    full = dtype == torch.float32

    def enter(mod, args, kwargs):
        device = _device_of(mod, args, kwargs)
        context = (torch.autocast(device, enabled=False) if full else
                   torch.autocast(device, dtype=dtype))
        out_dtype = torch.float32
        if in_input_dtype:  # the first floating input's
            out_dtype = next((t.dtype for t in _tensors(args, kwargs)
                              if t.is_floating_point()), out_dtype)
        mod.__dict__.setdefault('_autocast_contexts', []).append(
            (context, out_dtype))
        context.__enter__()
        return (to_float(args), to_float(kwargs)) if full else None

    def leave(mod, args, output):
        context, out_dtype = mod._autocast_contexts.pop()
        context.__exit__(None, None, None)
        return to_float(output, out_dtype)
    return [module.register_forward_pre_hook(enter, with_kwargs=True),
            module.register_forward_hook(leave, always_call=True)]


def instances(model: nn.Module, class_name: str) -> List[nn.Module]:
    """The modules of ``model`` whose class is named ``class_name`` (without
    its module path: ``'RoIAlign'``)."""
    return [m for m in model.modules() if type(m).__name__ == class_name]


def _device_of(module: nn.Module, args: tuple, kwargs: dict) -> str:
    """The device type ``module`` computes on: its parameters', else its
    first tensor input's (mmcv's RoIAlign has no parameters)."""
    param = next(module.parameters(), None)
    if param is not None:
        return param.device.type
    tensor = next(_tensors(args, kwargs), None)
    return 'cpu' if tensor is None else tensor.device.type


def _tensors(args: tuple, kwargs: dict):
    """The tensors among a call's arguments (not inside containers)."""
    return (v for v in (*args, *kwargs.values())
            if isinstance(v, torch.Tensor))


class PartsHook(Hook):
    """While started, the named ``parts`` of the model (dotted module names,
    below any wrapper) run in ``dtype`` through :func:`autocast_part`, and
    its modules of the classes named in ``types`` in fp32, each handing its
    outputs back in its input's dtype (kernels without the low precision,
    :data:`WITHOUT_BF16_KERNELS`); subclasses say when, and what the log
    says (:meth:`running`)."""
    priority = 'NORMAL'

    def __init__(self, dtype: torch.dtype, parts: Sequence[str],
                 types: Sequence[str] = ()):
        self.dtype = dtype
        self.parts = tuple(parts)
        self.types = tuple(types)
        self._handles: List = []

    def running(self) -> str:
        """How the parts run, for the log."""
        raise NotImplementedError

    def applies(self, model: nn.Module) -> bool:
        """Whether the parts run as the hook says on ``model``'s device."""
        return True

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
        if not self.applies(model):
            return
        typed = {t: instances(model, t) for t in self.types}
        for part in self.parts:
            self._handles += autocast_part(names[part], self.dtype)
        for module in [m for found in typed.values() for m in found]:
            self._handles += autocast_part(module, torch.float32,
                                           in_input_dtype=True)
        if self.parts:
            runner.logger.info(f'{", ".join(self.parts)} run in '
                               f'{self.running()}')
        counts = [f'{len(found)} {t}' for t, found in typed.items() if found]
        if counts:
            runner.logger.info(f'{", ".join(counts)} run in float32 '
                               '(autocast off inside them)')

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

    In bf16, mmcv's modules without bf16 kernels
    (:data:`WITHOUT_BF16_KERNELS`: deformable attention and convolutions,
    RoIAlign) run in fp32 and hand back what they were given. On a CPU
    without native bf16 (:func:`cpu_has_native_bf16`), where bf16 costs
    several times fp32's time, the parts run in fp32 as written, and the
    log says so once.

    Args:
        dtype (str): ``'bfloat16'`` (GPUs, CPUs with native bf16: AVX-512
            BF16, AMX, Arm BF16) or ``'float16'`` (GPUs).
        parts (sequence of str): the modules to run in ``dtype``; default
            the networks of Mask R-CNN (:data:`DETECTOR_PARTS`).
    """
    def __init__(self, dtype: str = 'bfloat16',
                 parts: Sequence[str] = DETECTOR_PARTS):
        if dtype not in ('bfloat16', 'float16'):
            raise UserError(f"AutocastPartsHook's dtype must be 'bfloat16' "
                            f"or 'float16', got {dtype!r}.")
        super().__init__(getattr(torch, dtype), parts,
                         WITHOUT_BF16_KERNELS if dtype == 'bfloat16' else ())

    def running(self) -> str:
        return (f'{str(self.dtype)[6:]} (torch.autocast), their outputs and '
                'everything between them in float32')

    def applies(self, model: nn.Module) -> bool:
        param = next(model.parameters(), None)
        return autocast_fits(
            'cpu' if param is None else param.device.type, self.dtype,
            'AutocastPartsHook', ', '.join(self.parts))

    def before_val(self, runner) -> None:
        self._start(runner)

    def before_test(self, runner) -> None:
        self._start(runner)

    after_val = PartsHook._stop
    after_test = PartsHook._stop


@HOOKS.register_module()
class Float32PartsHook(PartsHook):
    """Run ``parts`` of the model (dotted module names) and its modules of
    the classes named in ``types`` in fp32 under autocast, for the whole
    run (AMP training, fp16 validation and testing): autocast off inside
    each, its floating inputs cast to fp32. (The Mask2Former recipes' pixel
    decoder is in fp32 by its own type, as Mask2Former's published code
    runs it: :mod:`xcit_dense.pixel_decoder`.) Without autocast nothing
    changes. In a config::

        custom_hooks = [dict(type='xcit_dense.Float32PartsHook',
                             parts=['roi_head.mask_head'])]

    Args:
        parts (sequence of str): the modules to run in fp32.
        types (sequence of str): class names (without module path) whose
            every instance in the model runs in fp32 and hands its outputs
            back in its first input's dtype (for kernels without bf16,
            whose callers expect what they gave), e.g. mmcv's
            ``['RoIAlign', 'MultiScaleDeformableAttention']``
            (:data:`WITHOUT_BF16_KERNELS`); a class the model does not
            have is passed over.
    """
    def __init__(self, parts: Sequence[str] = (),
                 types: Sequence[str] = ()):
        if isinstance(parts, str) or isinstance(types, str) or \
                not (parts or types):
            raise UserError(
                'Float32PartsHook: parts must be a list of module names '
                "(e.g. ['panoptic_head.pixel_decoder']) and types a list of "
                "module class names (e.g. ['RoIAlign']), one of them not "
                f'empty; got parts={parts!r}, types={types!r}.')
        super().__init__(torch.float32, parts, types)

    def running(self) -> str:
        return 'float32 (autocast off inside them)'

    def before_run(self, runner) -> None:
        self._start(runner)

    def after_run(self, runner) -> None:
        self._stop(runner)
