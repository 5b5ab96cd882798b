"""Triton, where PyTorch ships it, and whether the package's Triton kernels
work on a device: the kernels' modules import Triton from here and run only
where :func:`available` and :func:`works` say so."""
import logging
from typing import Callable, Dict, Tuple

import torch
from mmengine.logging import print_log

from ...errors import first_line

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (a platform PyTorch ships without it)
    triton = tl = None

#: (kernels, device, dtype) -> whether their probe ran
_VERDICTS: Dict[Tuple[str, str, torch.dtype], bool] = {}


def available() -> bool:
    """Triton is importable (the kernels can be compiled for a GPU, or
    interpreted with ``TRITON_INTERPRET=1``)."""
    return triton is not None


def works(kernels: str, device: torch.device, dtype: torch.dtype,
          probe: Callable[[torch.device, torch.dtype], None]) -> bool:
    """The Triton kernels named ``kernels`` compile and run on ``device``
    for ``dtype``: ``probe`` (their forward and backward on a tiny input)
    runs once per device and dtype in a process. If it fails (Triton cannot
    compile for that GPU, say), one warning names the error and the modules
    take their straightforward computation there from then on, so that a
    fast path never ends a run."""
    key = (kernels, str(device), dtype)
    verdict = _VERDICTS.get(key)
    if verdict is not None:
        return verdict
    if device.type == 'cuda' and torch.cuda.is_current_stream_capturing():
        return True  # a CUDA graph's warm-up call has probed them
    try:  # with gradients, whatever mode the caller is in
        with torch.inference_mode(False), torch.enable_grad(), \
                torch.autocast(device.type, enabled=False):
            probe(device, dtype)
        verdict = True
    except Exception as error:  # Triton's compiler or the driver
        verdict = False
        print_log(
            f'XCiT: the Triton kernels of {kernels} failed on {device} for '
            f'{dtype} ({first_line(error)}); its straightforward computation '
            f'runs there from now on. Set fast_path=False to skip the '
            f'kernels.', logger='current', level=logging.WARNING)
    _VERDICTS[key] = verdict
    return verdict
