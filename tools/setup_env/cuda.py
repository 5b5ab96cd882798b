"""Which GPUs, which CUDA compiler, whether mmcv's CUDA ops run: the plan
``setup_env.sh`` follows on a machine, and its check after installing."""
import glob
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from . import SetupError

#: the registry's CUDA compiler and the headers mmcv's ops include
#: (NVIDIA's ``cuda-toolkit`` meta-package; ``nvcc`` brings nvvm, crt and the
#: runtime)
TOOLKIT_EXTRAS = 'nvcc,cccl'

def arch_list(capabilities: Sequence[Tuple[int, int]],
              env: Dict[str, str]) -> str:
    """``TORCH_CUDA_ARCH_LIST``: the user's, else the GPUs present
    (``'9.0'``; several kinds: ``'8.0;9.0'``); empty without a GPU."""
    if env.get('TORCH_CUDA_ARCH_LIST'):
        return env['TORCH_CUDA_ARCH_LIST']
    return ';'.join(f'{major}.{minor}'
                    for major, minor in sorted(set(capabilities)))


def nvcc_version(text: str) -> Optional[Tuple[int, int]]:
    """(major, minor) from ``nvcc --version``'s output."""
    m = re.search(r'release (\d+)\.(\d+)', text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _run_nvcc(nvcc: str) -> str:
    try:
        return subprocess.run([nvcc, '--version'], capture_output=True,
                              text=True, timeout=60).stdout
    except OSError:
        return ''


def nvcc_candidates(env: Dict[str, str]) -> List[str]:
    """Where a system CUDA compiler may be, in the order PyTorch's extension
    builder looks: ``CUDA_HOME`` / ``CUDA_PATH``, ``nvcc`` on the PATH,
    ``/usr/local/cuda``."""
    found = []
    for var in ('CUDA_HOME', 'CUDA_PATH'):
        if env.get(var):
            found.append(osp.join(env[var], 'bin', 'nvcc'))
    on_path = shutil.which('nvcc', path=env.get('PATH'))
    if on_path:
        found.append(on_path)
    found.append('/usr/local/cuda/bin/nvcc')
    return list(dict.fromkeys(found))


def choose_compiler(torch_cuda: str, candidates: Sequence[str],
                    version_of=lambda nvcc: nvcc_version(_run_nvcc(nvcc))
                    ) -> Tuple[Optional[str], List[str]]:
    """The CUDA_HOME of the first candidate compiler whose major version is
    PyTorch's (as PyTorch's extension builder requires), and notes on the
    ones passed over."""
    want = tuple(int(v) for v in torch_cuda.split('.')[:2])
    notes = []
    for nvcc in candidates:
        if not osp.isfile(nvcc):
            continue
        version = version_of(nvcc)
        if version is None:
            notes.append(f'{nvcc} does not report its version')
        elif version[0] != want[0]:
            notes.append(f'{nvcc} is CUDA {version[0]}.{version[1]}, '
                         f'PyTorch is built with CUDA {torch_cuda}')
        else:
            return osp.dirname(osp.dirname(nvcc)), notes
    return None, notes


def registry_requirement(torch_cuda: str,
                         installed_toolkit: Optional[str]) -> str:
    """The registry's compiler for PyTorch's CUDA: the ``cuda-toolkit``
    release installed with PyTorch when there is one, else the newest
    patch of PyTorch's CUDA version."""
    version = installed_toolkit or f'{torch_cuda}.*'
    return f'cuda-toolkit[{TOOLKIT_EXTRAS}]=={version}'


def merge_cuda_home(roots: Sequence[str], dest: str) -> str:
    """One CUDA_HOME from the registry's wheels (``nvidia/cu13`` holds all of
    CUDA 13; CUDA 12 spreads over ``nvidia/cuda_nvcc``, ``cuda_runtime``,
    ...): a tree of links to their ``bin``, ``include``, ``lib`` and ``nvvm``,
    with ``lib64`` and the unversioned ``libcudart.so`` the extension builder
    links against."""
    if osp.isdir(dest):
        shutil.rmtree(dest)
    for root in roots:
        for sub in ('bin', 'include', 'lib', 'nvvm'):
            top = osp.join(root, sub)
            for path in glob.glob(osp.join(top, '**', '*'), recursive=True):
                if osp.isdir(path) and not osp.islink(path):
                    continue
                target = osp.join(dest, sub, osp.relpath(path, top))
                if not osp.lexists(target):
                    os.makedirs(osp.dirname(target), exist_ok=True)
                    os.symlink(osp.abspath(path), target)
    lib = osp.join(dest, 'lib')
    os.makedirs(lib, exist_ok=True)
    versioned = sorted(glob.glob(osp.join(lib, 'libcudart.so.*')))
    if versioned and not osp.lexists(osp.join(lib, 'libcudart.so')):
        os.symlink(osp.basename(versioned[0]), osp.join(lib, 'libcudart.so'))
    if not osp.lexists(osp.join(dest, 'lib64')):
        os.symlink('lib', osp.join(dest, 'lib64'))
    if not osp.isfile(osp.join(dest, 'bin', 'nvcc')):
        raise SetupError(
            f'No CUDA compiler in the installed wheels ({", ".join(roots)} '
            f'have no bin/nvcc). Install a CUDA toolkit whose version '
            f'matches PyTorch\'s and set CUDA_HOME to it.')
    return dest


def registry_roots(site_packages: str) -> List[str]:
    """The folders of NVIDIA's wheels below ``site_packages/nvidia`` that hold
    a part of the toolkit."""
    roots = []
    for path in sorted(glob.glob(osp.join(site_packages, 'nvidia', '*'))):
        if any(osp.isdir(osp.join(path, sub))
               for sub in ('bin', 'include', 'lib', 'nvvm')):
            roots.append(path)
    return roots

def gpu_without_torch_paragraph(torch_version: str,
                                torch_cuda: Optional[str],
                                smi_gpus: str) -> str:
    if torch_cuda is None:
        return (f'nvidia-smi sees {smi_gpus.strip()}, but PyTorch '
                f'{torch_version} is a CPU-only build, so mmcv cannot be '
                f'built with its CUDA ops. Install a CUDA build of PyTorch '
                f'(the default wheels from PyPI on Linux are), or set '
                f'FORCE_CUDA=0 to set up for the CPU on purpose.')
    return (f'nvidia-smi sees {smi_gpus.strip()}, but PyTorch '
            f'{torch_version} (CUDA {torch_cuda}) cannot use it: '
            f'torch.cuda.is_available() is False. The usual cause is an '
            f'NVIDIA driver older than CUDA {torch_cuda} needs (CUDA 13 '
            f'needs driver 580 or newer; `nvidia-smi` shows the driver\'s '
            f'CUDA version): update the driver, or use a PyTorch built '
            f'for an older CUDA. FORCE_CUDA=0 sets up for the CPU.')


def _nvidia_smi() -> str:
    if not shutil.which('nvidia-smi'):
        return ''
    try:
        return subprocess.run(['nvidia-smi', '-L'], capture_output=True,
                              text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ''


def gpu_capabilities() -> List[Tuple[int, int]]:
    """The compute capability of each GPU PyTorch sees (none without
    CUDA)."""
    import torch
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_capability(i)
            for i in range(torch.cuda.device_count())]


def plan(env: Dict[str, str]) -> Dict[str, str]:
    """What ``setup_env.sh`` does on this machine (see the module
    docstring)."""
    import torch
    force = env.get('FORCE_CUDA')
    if force == '0':
        return dict(ARCHS='')
    capabilities = gpu_capabilities()
    if not capabilities and force != '1':
        smi = _nvidia_smi()
        if smi.strip():
            raise SetupError(gpu_without_torch_paragraph(
                torch.__version__, torch.version.cuda, smi))
        return dict(ARCHS='')
    archs = arch_list(capabilities, env)
    if not archs:
        raise SetupError('FORCE_CUDA=1 without a GPU: name the GPUs to '
                         'build for in TORCH_CUDA_ARCH_LIST (for example '
                         '"8.0;9.0").')
    if torch.version.cuda is None:
        raise SetupError(gpu_without_torch_paragraph(
            torch.__version__, None, 'a GPU'))
    home, notes = choose_compiler(torch.version.cuda, nvcc_candidates(env))
    for note in notes:
        print(f'[setup_env] passed over: {note}', file=sys.stderr)
    result = dict(ARCHS=archs, TORCH_CUDA=torch.version.cuda)
    if home is not None:
        result['CUDA_HOME'] = home
    else:
        from importlib import metadata
        try:
            installed = metadata.version('cuda-toolkit')
        except metadata.PackageNotFoundError:
            installed = None
        result['CUDA_WHEELS'] = registry_requirement(torch.version.cuda,
                                                     installed)
    return result


def check_ops() -> None:
    """mmcv's RoIAlign and NMS on CUDA tensors, against their CPU results;
    first, that there is a GPU PyTorch can use."""
    import torch
    if not torch.cuda.is_available():
        smi = _nvidia_smi()
        if smi.strip():
            raise SetupError(gpu_without_torch_paragraph(
                torch.__version__, torch.version.cuda, smi))
        raise SetupError(
            'There is no GPU here: no NVIDIA driver answers (nvidia-smi '
            'finds no GPU) and PyTorch sees no CUDA device, so mmcv\'s CUDA '
            'ops cannot run on this machine. Run the check on the GPU '
            'machine; here, the CPU set-up needs no CUDA ops.')
    try:
        from mmcv.ops import RoIAlign, nms
        feats = torch.arange(2 * 4 * 16 * 16, dtype=torch.float32).view(
            2, 4, 16, 16) / 100
        rois = torch.tensor([[0, 1., 1., 10., 12.], [1, 2., 3., 14., 15.]])
        align = RoIAlign((4, 4), 1.0, 2, aligned=True)
        out = align(feats.cuda(), rois.cuda())
        torch.testing.assert_close(out.cpu(), align(feats, rois),
                                   rtol=1e-4, atol=1e-5)
        boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.],
                              [20., 20., 30., 30.]])
        scores = torch.tensor([0.9, 0.8, 0.7])
        _, keep = nms(boxes.cuda(), scores.cuda(), 0.5)
        assert keep.is_cuda and keep.tolist() == [0, 2], keep
    except Exception as err:  # what failed is in the paragraph
        reason = (str(err).splitlines() or [''])[0]
        raise SetupError(
            f'mmcv was installed, but its CUDA ops do not run on this GPU '
            f'({type(err).__name__}: {reason}). '
            f'mmcv must be built with FORCE_CUDA=1 by a CUDA compiler '
            f'matching PyTorch\'s CUDA {torch.version.cuda}, for this GPU\'s '
            f'architecture: remove build/mmcv-* and the virtual environment '
            f'and run `make install` again on the GPU machine (or set '
            f'CUDA_HOME to a matching toolkit).') from err
    print(f'[setup_env] mmcv CUDA ops: RoIAlign and NMS run on '
          f'{torch.cuda.get_device_name()}')
