"""The GPU half of ``tools/setup_env.sh``: which GPUs, which CUDA compiler,
and whether mmcv's CUDA ops run.

    python tools/cuda_setup.py plan       # assignments for setup_env.sh
    python tools/cuda_setup.py cuda-home  # CUDA_HOME from registry wheels
    python tools/cuda_setup.py check      # RoIAlign and NMS on CUDA
    python tools/cuda_setup.py torch      # PyTorch in the supported range

``plan`` prints ``ARCHS`` (``TORCH_CUDA_ARCH_LIST`` for the GPUs present,
empty on a machine without one: the CPU build), ``CUDA_HOME`` (a system CUDA
toolkit whose compiler matches PyTorch's CUDA version) or ``CUDA_WHEELS``
(the package-registry requirement that provides one), and stops with one
paragraph when a GPU is visible but cannot be used. Every decision is a
function of its inputs, tested on the CPU (tests/test_cuda_setup.py).
"""
import glob
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

#: the registry's CUDA compiler and the headers mmcv's ops include
#: (NVIDIA's ``cuda-toolkit`` meta-package; ``nvcc`` brings nvvm, crt and the
#: runtime)
TOOLKIT_EXTRAS = 'nvcc,cccl'


class SetupError(Exception):
    """What is missing, and how to provide it (one paragraph)."""


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
    return _version(low), _version(high)


def _version(text: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r'\d+', text.split('+')[0])[:3])


def check_torch(version: str, requirements: str) -> str:
    """A note on an untested PyTorch in the supported range; one paragraph
    (SetupError) outside it."""
    low, high = torch_range(requirements)
    v = _version(version)
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


def plan(env: Dict[str, str]) -> Dict[str, str]:
    """What ``setup_env.sh`` does on this machine (see the module
    docstring)."""
    import torch
    force = env.get('FORCE_CUDA')
    if force == '0':
        return dict(ARCHS='')
    capabilities = [torch.cuda.get_device_capability(i)
                    for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
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
    """mmcv's RoIAlign and NMS on CUDA tensors, against their CPU results."""
    import torch
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


def main(argv: Sequence[str]) -> int:
    command = argv[0] if argv else ''
    try:
        if command == 'plan':
            for key, value in plan(dict(os.environ)).items():
                print(f"{key}='{value}'")
        elif command == 'cuda-home':
            import sysconfig
            site = sysconfig.get_paths()['purelib']
            dest = osp.join(sys.prefix, 'cuda')
            print(merge_cuda_home(registry_roots(site), dest))
        elif command == 'check':
            check_ops()
        elif command == 'torch':
            import torch
            note = check_torch(torch.__version__, osp.join(
                osp.dirname(osp.dirname(osp.abspath(__file__))),
                'requirements', 'runtime.txt'))
            print(f'[setup_env] PyTorch {torch.__version__} of {sys.prefix}'
                  + (f': {note}' if note else ''))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except SetupError as err:
        print(f'[setup_env] {err}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
