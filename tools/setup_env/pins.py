"""The PyTorch an offline set-up accepts (``WHEELHOUSE``, ``SYSTEM_TORCH``:
the PyTorch of a Python that has one) and the pins it installs with."""
import os.path as osp
import re
from typing import Dict, List, Optional, Sequence, Tuple

from . import REPO, SetupError

#: PyTorch releases the whole stack was run with (tests/, the demos): the
#: pinned CPU stack and the GPU machine's image
TESTED_TORCH = ('2.11', '2.12')


def torch_range(requirements: str) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(lowest, first unsupported) PyTorch from ``torch>=A,<B`` in
    requirements/runtime.txt."""
    with open(requirements) as f:
        line = next(ln for ln in f if re.match(r'torch\s*[<>=]', ln))
    low = re.search(r'>=\s*([\d.]+)', line).group(1)
    high = re.search(r'<\s*([\d.]+)', line).group(1)
    return version_tuple(low), version_tuple(high)


def version_tuple(text: str) -> Tuple[int, ...]:
    """(2, 11, 0) of '2.11.0+cu130' (the local label dropped)."""
    return tuple(int(p) for p in re.findall(r'\d+', text.split('+')[0])[:3])


def check_torch(version: str, requirements: str) -> str:
    """A note on an untested PyTorch in the supported range; one paragraph
    (SetupError) outside it."""
    low, high = torch_range(requirements)
    v = version_tuple(version)
    if not low <= v < high:
        raise SetupError(
            f'PyTorch {version} is outside the range this stack supports '
            f'(>={".".join(map(str, low))}, <{".".join(map(str, high))}: '
            f'mmcv 2.1.0 compiles with C++17, which newer PyTorch headers '
            f'do not accept). Use a Python whose PyTorch is in that range '
            f'(PYTHON=...), or let the set-up install the pinned one '
            f'(without WHEELHOUSE / SYSTEM_TORCH).')
    if '.'.join(map(str, v[:2])) not in TESTED_TORCH:
        return (f'PyTorch {version} is in the supported range but was not '
                f'tested here (tested: {", ".join(TESTED_TORCH)})')
    return ''

#: PyTorch's own stack, which a set-up over a Python's PyTorch keeps (the
#: names setup_env.sh drops from requirements/constraints.txt)
TORCH_STACK = re.compile(r'(torch|triton|nvidia-|cuda-)', re.IGNORECASE)
#: ... and pins at the versions installed there, so that pip, which sees
#: them installed, never replaces them with others
PINNED_AS_INSTALLED = ('torch', 'torchvision', 'triton')


def system_torch_constraints(lines: Sequence[str],
                             installed: Dict[str, Optional[str]]
                             ) -> List[str]:
    """requirements/constraints.txt without PyTorch's stack, plus the
    installed versions of ``PINNED_AS_INSTALLED`` (``installed``: name ->
    version, None when absent)."""
    kept = [ln.rstrip('\n') for ln in lines
            if not TORCH_STACK.match(ln.strip())]
    return kept + ['# the PyTorch the set-up was made over, as installed'] + [
        f'{name}=={installed[name]}' for name in PINNED_AS_INSTALLED
        if installed.get(name)]

def pinned_version(name: str) -> str:
    with open(osp.join(REPO, 'requirements', 'constraints.txt')) as f:
        return next(ln.split('==')[1].strip() for ln in f
                    if ln.lower().startswith(f'{name}=='))
