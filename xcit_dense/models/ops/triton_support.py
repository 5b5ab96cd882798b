"""Triton, where PyTorch ships it, and whether the package's Triton kernels
work on a device: the kernels' modules import Triton from here and run only
where :func:`available` and :func:`works` say so."""
import contextlib
import logging
import threading
from typing import Callable, ContextManager, Dict, Hashable, Tuple

import torch
from mmengine.logging import print_log

from ...errors import first_line

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (a platform PyTorch ships without it)
    triton = tl = None

#: (kernels, device, dtype, settings, variant) -> whether their probe ran
_VERDICTS: Dict[Tuple[str, str, torch.dtype, Hashable, Hashable], bool] = {}
#: (kernels, device, dtype) -> the error that stopped them there
_FAILURES: Dict[Tuple[str, str, torch.dtype], str] = {}


def available() -> bool:
    """Triton is importable (the kernels can be compiled for a GPU, or
    interpreted with ``TRITON_INTERPRET=1``)."""
    return triton is not None


def on_device(t: torch.Tensor) -> ContextManager:
    """``t``'s CUDA device made the current one while the kernels launch
    (Triton launches on the current device; autograd runs a backward on its
    tensors' device already); nothing to do elsewhere."""
    if t.is_cuda and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


def works(kernels: str, device: torch.device, dtype: torch.dtype,
          probe: Callable[..., None], settings: Hashable = (),
          **variant: Hashable) -> bool:
    """The Triton kernels named ``kernels`` compile and run on ``device``
    for ``dtype`` and ``variant`` (what else Triton compiles them for: the
    sizes and switches that are their compile-time constants, the dtypes of
    their other inputs, whether their backward runs) under ``settings``
    (PyTorch's settings they read, the same for the probe):
    ``probe(device, dtype, **variant)`` (those kernels on a tiny input) runs
    once per device, dtype, settings and variant in a process. If it fails
    (Triton cannot compile for that GPU, say), one warning names the error
    and the modules take their straightforward computation on that device
    and dtype from then on (every variant), so that a fast path never ends
    a run."""
    key = (kernels, str(device), dtype, settings, tuple(variant.items()))
    verdict = _VERDICTS.get(key)
    if verdict is not None:
        return verdict
    if device.type == 'cuda' and torch.cuda.is_current_stream_capturing():
        return True  # a CUDA graph's warm-up call has probed them
    if any(k[:3] == key[:3] and v is False for k, v in _VERDICTS.items()):
        _VERDICTS[key] = False  # said once: not tried again there
        return False
    try:
        _apart(probe, device, dtype, **variant)
        verdict = True
    except Exception as error:  # Triton's compiler or the driver
        verdict = False
        _FAILURES[key[:3]] = first_line(error)
        print_log(
            f'XCiT: the Triton kernels of {kernels} failed on {device} for '
            f'{dtype} ({first_line(error)}); its straightforward computation '
            f'runs there from now on. Set fast_path=False to skip the '
            f'kernels.', logger='current', level=logging.WARNING)
    _VERDICTS[key] = verdict
    return verdict


def _apart(probe: Callable[..., None], *args, **kwargs) -> None:
    """``probe(*args, **kwargs)`` in a thread of its own, whose autograd
    state is PyTorch's default, not the caller's: a probe that first runs
    inside a checkpointed block (``with_cp``) would otherwise record its
    tensors with the checkpoint's, which then finds fewer in the
    recomputation (where the verdict is known) and stops the backward.
    Autocast is off there too (the probe gives the kernels their dtypes
    itself). Its error, if any, is raised here."""
    failure = []

    def run():
        try:
            probe(*args, **kwargs)
        except BaseException as error:  # raised in the caller
            failure.append(error)
    thread = threading.Thread(target=run, name='xcit-dense-kernel-probe')
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def verdicts(device_type: str) -> Dict[str, str]:
    """Which kernels this process has run or stopped on devices of
    ``device_type``, by kernels, device and dtype (every variant together):
    ``'ran'``, or the error that sent that device and dtype to the
    straightforward computation (for benchmark rows, which say what they
    measured)."""
    out: Dict[str, str] = {}
    for (kernels, device, dtype, _, _), ran in _VERDICTS.items():
        if device.split(':')[0] != device_type:
            continue
        name = f'{kernels}, {device}, {str(dtype).replace("torch.", "")}'
        if not ran:  # a failure is kept for every variant there
            out[name] = _FAILURES[kernels, device, dtype]
        else:
            out.setdefault(name, 'ran')
    return out
