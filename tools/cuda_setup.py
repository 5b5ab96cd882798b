"""The GPU and offline halves of ``tools/setup_env.sh``: which GPUs, which
CUDA compiler, whether mmcv's CUDA ops run; a virtual environment over the
PyTorch of a Python that may itself be a virtual environment's; prebuilt
mmcv wheels with CUDA ops, described, added to a wheelhouse and chosen.

    python tools/cuda_setup.py plan       # assignments for setup_env.sh
    python tools/cuda_setup.py cuda-home  # CUDA_HOME from registry wheels
    python tools/cuda_setup.py check      # RoIAlign and NMS on CUDA
    python tools/cuda_setup.py torch      # PyTorch in the supported range
    python tools/cuda_setup.py venv DEST [--without-pip]
                                          # a venv that sees this Python's
                                          # packages (run by that Python)
    python tools/cuda_setup.py system-constraints SRC DEST
                                          # the pins, PyTorch's as installed
    python tools/cuda_setup.py describe WHEEL ARCHS  # WHEEL.json: what a
                                          # CUDA build of mmcv is for
    python tools/cuda_setup.py prebuilt WHEELHOUSE   # the prebuilt mmcv
                                          # wheel for this PyTorch and GPUs
    python tools/cuda_setup.py wheelhouse-mmcv DEST PYTHON_VERSION
                                          # this environment's CUDA mmcv
                                          # wheel, into a wheelhouse

``plan`` prints ``ARCHS`` (``TORCH_CUDA_ARCH_LIST`` for the GPUs present,
empty on a machine without one: the CPU build), ``CUDA_HOME`` (a system CUDA
toolkit whose compiler matches PyTorch's CUDA version) or ``CUDA_WHEELS``
(the package-registry requirement that provides one), and stops with one
paragraph when a GPU is visible but cannot be used. ``prebuilt`` prints
the wheel to install, or says on one line why none suits (exit status 1).
``check`` on a machine without a GPU PyTorch can use says so (no NVIDIA
driver, or one PyTorch cannot use). A command line other than the above
ends with one paragraph (exit status 2); without a command, this text.
Every decision is a function of its inputs, tested on the CPU
(tests/test_cuda_setup.py).
"""
import csv
import glob
import json
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import zipfile
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


# -- the offline set-up over a Python that has PyTorch (WHEELHOUSE,
# SYSTEM_TORCH) --------------------------------------------------------------

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))

#: the file through which a venv made by ``venv`` sees the packages of the
#: Python that made it, when that Python is itself a venv's
OUTER_SITE_PTH = 'xcit_dense_outer_site.pth'


def site_dirs() -> List[str]:
    """This Python's site-packages folders in its ``sys.path`` order: a
    venv's own, then the base installation's when the venv includes them
    (``site.getsitepackages()``), and the user's when enabled."""
    import site
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    position = {path: i for i, path in enumerate(sys.path)}
    return sorted({d for d in dirs if d in position}, key=position.get)


def outer_site_pth(dirs: Sequence[str]) -> str:
    """The text of ``OUTER_SITE_PTH``: ``site.addsitedir`` of each folder
    not already on ``sys.path``. A folder merely listed in a .pth file is
    appended to ``sys.path`` without the .pth files inside it (editable
    installs, setuptools' distutils shim); ``addsitedir`` processes them as
    the outer Python does."""
    # one line (a .pth file runs lines that start with `import`), run by
    # exec() in a function of site.py: no comprehension, whose own scope
    # would not see the names imported here
    return ('# tools/cuda_setup.py venv: the site-packages of the Python '
            'this environment was made with (itself a virtual environment)\n'
            'import site, sys; ' + '; '.join(
                f'{d!r} in sys.path or site.addsitedir({d!r})'
                for d in dirs) + '\n')


def make_venv(dest: str, with_pip: bool = True) -> List[str]:
    """A virtual environment at ``dest`` (made when missing) whose Python
    sees this Python's packages, its PyTorch first of all; log lines.

    ``python -m venv --system-site-packages`` gives the new environment the
    site-packages of the *base* installation. Over a system or conda Python
    that is where PyTorch is, and that is what is done. But run by a Python
    that is itself a virtual environment's (``sys.prefix !=
    sys.base_prefix``: the GPU image's ``/opt/.../.venv/bin/python3``), the
    new one is made over the same base and does not see that environment's
    site-packages: ``import torch`` fails. Then it is made without
    ``--system-site-packages``, and a .pth file in its site-packages adds
    this Python's site-packages folders (``site_dirs``: the venv's, and the
    base's only if this venv includes them, so the new one sees exactly
    what this Python sees) after its own. pip in the new environment reads
    ``sys.path``, so it counts those packages as installed; it installs
    into the new environment only (whose site-packages come first, so a
    pinned setuptools there wins), and never uninstalls outside it;
    setup_env.sh also pins PyTorch's stack at the installed versions
    (``system_torch_constraints``) so that pip cannot replace it with
    another. Passed over: linking or copying the outer site-packages (a
    snapshot, and pip would treat them as its own to uninstall),
    PYTHONPATH (lost outside the set-up's shell), pointing ``home`` in
    pyvenv.cfg at the outer venv (a venv's bin/ is not an installation
    Python can start from)."""
    if osp.realpath(dest) == osp.realpath(sys.prefix):
        return [f'{dest} is the environment of {sys.executable} itself']
    nested = sys.prefix != sys.base_prefix
    python = osp.join(dest, 'bin', 'python')
    notes = []
    if not osp.isfile(osp.join(dest, 'pyvenv.cfg')):
        cmd = [sys.executable, '-m', 'venv', dest]
        if not nested:
            cmd.append('--system-site-packages')
        if not with_pip:
            cmd.append('--without-pip')
        made = subprocess.run(cmd, capture_output=True, text=True)
        if made.returncode != 0:
            lines = made.stderr.strip().splitlines() or ['no message']
            raise SetupError(f'Cannot make a virtual environment at {dest} '
                             f'({lines[-1].strip()}): give a folder this '
                             f'process can create and write in.')
        notes.append(
            f'created {dest} over {sys.executable} and its packages ' +
            (f'(a virtual environment\'s: {OUTER_SITE_PTH})' if nested
             else '(--system-site-packages)'))
    if not nested:
        return notes
    dirs = site_dirs()

    def run(code: str) -> str:
        return subprocess.run([python, '-c', code], capture_output=True,
                              text=True, check=True).stdout.strip()

    purelib = run('import sysconfig; print(sysconfig.get_paths()["purelib"])')
    with open(osp.join(purelib, OUTER_SITE_PTH), 'w') as f:
        f.write(outer_site_pth(dirs))
    seen = json.loads(run('import json, sys; print(json.dumps(sys.path))'))
    missing = [d for d in dirs if d not in seen]
    if missing:
        raise SetupError(
            f'{python} does not see {", ".join(missing)} of '
            f'{sys.executable} through {purelib}/{OUTER_SITE_PTH}: remove '
            f'{dest} and run the set-up again.')
    return notes


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


# -- a prebuilt mmcv with CUDA ops in the wheelhouse --------------------------
# setup_env.sh describes each mmcv it builds with CUDA ops in a JSON file
# next to the wheel (WHEEL.json, ``describe_wheel``): mmcv, PyTorch and CUDA
# versions, TORCH_CUDA_ARCH_LIST, Python and platform tags. A side file
# rather than a local version label (mmcv-2.1.0+cu130.sm90): renaming a
# wheel means rewriting its metadata, and the description stays readable
# and extensible. `make wheelhouse` copies the wheel with its description
# into WHEELHOUSE/mmcv-cuda/<what it is for>/ (one folder per build: wheels
# for other GPUs have the same file name), out of the wheelhouse's top
# level that pip's --find-links reads, so that pip never picks one by
# itself. On a node, setup_env.sh installs the first one whose description
# matches (``prebuilt_mismatch``) and then runs ``check``.

PREBUILT_DIR = 'mmcv-cuda'


def _public(version: Optional[str]) -> str:
    return (version or '').split('+')[0]


def python_tag() -> str:
    return 'cp%d%d' % sys.version_info[:2]


def wheel_tags(filename: str) -> Dict[str, str]:
    """name, version, python, abi and platform of a wheel's file name."""
    parts = osp.basename(filename)[:-len('.whl')].split('-')
    if len(parts) == 6:  # with a build tag
        del parts[2]
    if not filename.endswith('.whl') or len(parts) != 5:
        raise SetupError(
            f'{filename} is not named as a wheel is '
            f'(NAME-VERSION-PYTHON-ABI-PLATFORM.whl, e.g. '
            f'mmcv-2.1.0-cp311-cp311-linux_x86_64.whl).')
    name, version, python, abi, platform = parts
    return dict(name=name, version=version, python=python, abi=abi,
                platform=platform)


def glibc_version() -> Optional[str]:
    """This machine's GNU C library version (``'2.36'``), None elsewhere
    (musl, macOS)."""
    import platform
    lib, version = platform.libc_ver()
    return version if lib == 'glibc' and version else None


def describe_wheel(wheel: str, arch_list: str, torch_version: str,
                   torch_cuda: str, glibc: Optional[str]) -> Dict[str, str]:
    """What a CUDA build of mmcv was built for (its WHEEL.json), with the
    GNU C library it was built against (its ``linux_x86_64`` tag does not
    say: the compiled ops need that version or a newer one)."""
    tags = wheel_tags(wheel)
    return dict(wheel=osp.basename(wheel), mmcv=tags['version'],
                torch=torch_version, cuda=torch_cuda, arch_list=arch_list,
                python=tags['python'], platform=tags['platform'],
                glibc=glibc)


def arch_covers(arch_list: str, capability: Tuple[int, int]) -> bool:
    """Whether code built with ``TORCH_CUDA_ARCH_LIST=arch_list`` runs on a
    GPU of that compute capability, by CUDA's rules: code for X.Y runs on
    X.Z for Z >= Y (same major), PTX (``X.Y+PTX``) on any later GPU after a
    JIT compilation, arch-specific code (``9.0a``) on X.Y only. Names
    (``Hopper``) are not understood: no match."""
    for entry in re.split(r'[;\s]+', arch_list.strip()):
        m = re.fullmatch(r'(\d+)\.(\d+)([a-z]?)(\+PTX)?', entry)
        if not m:
            continue
        built = (int(m.group(1)), int(m.group(2)))
        if built == tuple(capability):
            return True
        if m.group(3):
            continue
        if m.group(4) and built <= tuple(capability):
            return True
        if built[0] == capability[0] and built[1] <= capability[1]:
            return True
    return False


def prebuilt_mismatch(built: Dict, present: Dict) -> Optional[str]:
    """None when a wheel built for ``built`` (its WHEEL.json) suits this
    machine (``present``: mmcv, the pin; torch, cuda: PyTorch's versions;
    capabilities: the GPUs'; python: the tag; machine: x86_64, aarch64),
    else why not. mmcv's ops link against PyTorch's C++ library, which has
    no stable ABI: its version must be the same (the local label aside:
    CUDA is compared by itself); and against the GNU C library of the
    machine that built them, which this one's must be at least (a
    description without it is checked by installing and running the ops)."""
    if built.get('mmcv') != present['mmcv']:
        return f'mmcv {built.get("mmcv")}, the pin is {present["mmcv"]}'
    if built.get('python') != present['python']:
        return f'for {built.get("python")}, this Python is {present["python"]}'
    if not str(built.get('platform', '')).endswith(present['machine']):
        return (f'for {built.get("platform")}, this machine is '
                f'{present["machine"]}')
    if built.get('glibc') and present.get('glibc') and \
            _version(present['glibc']) < _version(built['glibc']):
        return (f'built against glibc {built["glibc"]}, this machine has '
                f'{present["glibc"]} (compiled code needs the C library it '
                'was built against or a newer one)')
    if _public(built.get('torch')) != _public(present['torch']):
        return (f'built against PyTorch {built.get("torch")}, this one is '
                f'{present["torch"]}')
    if present['cuda'] is None:
        return f'PyTorch {present["torch"]} is a CPU-only build'
    if built.get('cuda') != present['cuda']:
        return f'for CUDA {built.get("cuda")}, PyTorch\'s is {present["cuda"]}'
    if not present['capabilities']:
        return 'no GPU here to check it on'
    missing = sorted({tuple(c) for c in present['capabilities']
                      if not arch_covers(str(built.get('arch_list', '')), c)})
    if missing:
        return (f'built for TORCH_CUDA_ARCH_LIST={built.get("arch_list")}, '
                f'not for compute capability '
                f'{", ".join("%d.%d" % c for c in missing)}')
    return None


def choose_prebuilt(wheelhouse: str, present: Dict
                    ) -> Tuple[Optional[str], List[str]]:
    """The first wheel below ``wheelhouse`` whose description matches
    ``present``, and why each one before it did not."""
    notes = []
    for desc in sorted(glob.glob(osp.join(wheelhouse, '**', 'mmcv-*.whl.json'),
                                 recursive=True)):
        wheel = desc[:-len('.json')]
        where = osp.relpath(wheel, wheelhouse)
        try:
            with open(desc) as f:
                built = json.load(f)
        except (OSError, ValueError) as err:
            notes.append(f'{where}: unreadable description ({err})')
            continue
        reason = (prebuilt_mismatch(built, present) if osp.isfile(wheel)
                  else 'the wheel is missing')
        if reason is None:
            return wheel, notes
        notes.append(f'{where}: {reason}')
    return None, notes


def pinned_version(name: str) -> str:
    with open(osp.join(REPO, 'requirements', 'constraints.txt')) as f:
        return next(ln.split('==')[1].strip() for ln in f
                    if ln.lower().startswith(f'{name}=='))


def present_machine() -> Dict:
    """``prebuilt_mismatch``'s ``present`` for this machine."""
    import platform

    import torch
    return dict(mmcv=pinned_version('mmcv'), torch=torch.__version__,
                cuda=torch.version.cuda, python=python_tag(),
                machine=platform.machine(), glibc=glibc_version(),
                capabilities=gpu_capabilities())


def _record_hashes(text: str) -> Dict[str, str]:
    """path -> hash of the compiled files in a RECORD."""
    return {row[0]: row[1] for row in csv.reader(text.splitlines())
            if len(row) >= 2 and row[1] and row[0].endswith('.so')}


def wheel_of_installed(installed_record: str, wheels: Sequence[str]
                       ) -> Optional[str]:
    """The wheel among ``wheels`` the installed mmcv came from: the same
    compiled ops (hashes in its RECORD and in the installed one). Several
    wheels of one file name may lie around, built for other GPUs or another
    PyTorch; None for an mmcv without compiled ops."""
    mine = _record_hashes(installed_record)
    if not mine:
        return None
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as z:
                records = [n for n in z.namelist()
                           if n.endswith('.dist-info/RECORD')]
                if records and _record_hashes(
                        z.read(records[0]).decode()) == mine:
                    return wheel
        except (OSError, zipfile.BadZipFile):
            continue
    return None


def prebuilt_folder(built: Dict) -> str:
    """The wheelhouse's folder for one build:
    ``mmcv-cuda/mmcv-2.1.0-torch2.11.0-cuda13.0-arch9.0-cp312-glibc2.38``
    (builds on nodes of other OS releases side by side)."""
    arch = re.sub(r'[^0-9A-Za-z.+]+', '_', str(built['arch_list']))
    glibc = f'-glibc{built["glibc"]}' if built.get('glibc') else ''
    return osp.join(PREBUILT_DIR, f'mmcv-{built["mmcv"]}-torch'
                    f'{_public(built["torch"])}-cuda{built["cuda"]}-arch'
                    f'{arch}-{built["python"]}{glibc}')


def add_to_wheelhouse(dest: str, python_version: str,
                      installed_record: str, wheels: Sequence[str]
                      ) -> Tuple[Optional[str], str]:
    """Copy the installed mmcv's CUDA wheel (found among ``wheels``) and its
    description into ``dest``; (the folder or None, what was done)."""
    wheel = wheel_of_installed(installed_record, wheels)
    if wheel is None:
        return None, ('this environment\'s mmcv is not one the set-up built '
                      'with CUDA ops (build/mmcv-*/dist): no prebuilt mmcv '
                      'added, the nodes build it from its source')
    if not osp.isfile(wheel + '.json'):
        return None, (f'{wheel} has no description of what it was built for '
                      f'({osp.basename(wheel)}.json, written by '
                      f'`tools/cuda_setup.py describe WHEEL ARCHS`): not '
                      f'added')
    with open(wheel + '.json') as f:
        built = json.load(f)
    if built['python'] != 'cp' + python_version.replace('.', ''):
        return None, (f'{osp.basename(wheel)} is for {built["python"]}, the '
                      f'wheelhouse is for Python {python_version}: not added')
    folder = osp.join(dest, prebuilt_folder(built))
    if osp.realpath(osp.dirname(wheel)) != osp.realpath(folder):
        os.makedirs(folder, exist_ok=True)
        for path in (wheel, wheel + '.json'):
            shutil.copy2(path, folder)
    return folder, (f'mmcv {built["mmcv"]} with CUDA ops for PyTorch '
                    f'{built["torch"]}, CUDA {built["cuda"]}, '
                    f'TORCH_CUDA_ARCH_LIST={built["arch_list"]}, '
                    f'{built["python"]}: {folder}')


#: each command's arguments, as the module docstring gives them
USAGE = {
    'plan': '', 'cuda-home': '', 'check': '', 'torch': '',
    'venv': 'DEST [--without-pip]', 'system-constraints': 'SRC DEST',
    'describe': 'WHEEL ARCHS', 'prebuilt': 'WHEELHOUSE',
    'wheelhouse-mmcv': 'DEST PYTHON_VERSION',
}


def usage_problem(argv: Sequence[str]) -> Optional[str]:
    """What is wrong with a command line (one paragraph), None if
    nothing."""
    if not argv:
        return None
    command, args = argv[0], list(argv[1:])
    if command not in USAGE:
        return (f'unknown command {command!r}; the commands are '
                f'{", ".join(USAGE)} (python tools/cuda_setup.py alone '
                f'says what each does).')
    usage = f'usage: python tools/cuda_setup.py {command} {USAGE[command]}'
    names = [n for n in USAGE[command].split() if not n.startswith('[')]
    if command == 'venv' and args[1:] == ['--without-pip']:
        args = args[:1]
    if len(args) != len(names):
        got = f'got {" ".join(args)!r}' if args else 'got none'
        wanted = (f'{len(names)} argument{"s" if len(names) != 1 else ""} '
                  f'({", ".join(names)})' if names else 'no arguments')
        return f'{usage.rstrip()}: {command} takes {wanted}, {got}.'
    return None


def main(argv: Sequence[str]) -> int:
    command = argv[0] if argv else ''
    problem = usage_problem(argv)
    if problem is not None:
        print(f'[setup_env] {problem}', file=sys.stderr)
        return 2
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
                REPO, 'requirements', 'runtime.txt'))
            print(f'[setup_env] PyTorch {torch.__version__} in '
                  f'{osp.dirname(osp.dirname(torch.__file__))}'
                  + (f': {note}' if note else ''))
        elif command == 'venv':
            with_pip = not argv[2:]
            for note in make_venv(argv[1], with_pip=with_pip):
                print(f'[setup_env] {note}')
        elif command == 'system-constraints':
            from importlib import metadata
            installed = {}
            for name in PINNED_AS_INSTALLED:
                try:
                    installed[name] = metadata.version(name)
                except metadata.PackageNotFoundError:
                    installed[name] = None
            try:
                with open(argv[1]) as f:
                    lines = system_torch_constraints(f.readlines(),
                                                     installed)
            except OSError as err:
                raise SetupError(f'Cannot read the pins {argv[1]} '
                                 f'({err.strerror}).') from err
            try:
                with open(argv[2], 'w') as f:
                    f.write('\n'.join(lines) + '\n')
            except OSError as err:
                raise SetupError(f'Cannot write {argv[2]} '
                                 f'({err.strerror}).') from err
        elif command == 'describe':
            if not osp.isfile(argv[1]):
                raise SetupError(f'{argv[1]}: no such file; describe takes '
                                 f'the mmcv wheel a CUDA build made '
                                 f'(mmcv-*.whl).')
            import torch
            built = describe_wheel(argv[1], argv[2], torch.__version__,
                                   torch.version.cuda, glibc_version())
            with open(argv[1] + '.json', 'w') as f:
                json.dump(built, f, indent=1)
            print(f'[setup_env] {argv[1]}.json: {built}')
        elif command == 'prebuilt':
            present = present_machine()
            wheel, notes = choose_prebuilt(argv[1], present)
            if wheel is None:
                caps = ', '.join(sorted({'%d.%d' % c for c in
                                         present['capabilities']})) or 'none'
                print(f'[setup_env] no prebuilt mmcv in {argv[1]} is for '
                      f'PyTorch {present["torch"]}, CUDA {present["cuda"]}, '
                      f'GPUs {caps}, {present["python"]} ('
                      + ('; '.join(notes) or f'none below {PREBUILT_DIR}/')
                      + '): building it', file=sys.stderr)
                return 1
            print(wheel)
        elif command == 'wheelhouse-mmcv':
            from importlib import metadata
            try:
                record = metadata.distribution('mmcv').read_text('RECORD')
            except metadata.PackageNotFoundError:
                record = None
            wheels = sorted(glob.glob(osp.join(
                REPO, 'build', 'mmcv-*', 'dist', 'mmcv-*.whl'))) + sorted(
                glob.glob(osp.join(argv[1], '**', 'mmcv-*.whl'),
                          recursive=True))
            _, note = add_to_wheelhouse(argv[1], argv[2], record or '',
                                        wheels)
            print(f'[wheelhouse] {note}')
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except SetupError as err:
        print(f'[setup_env] {err}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
