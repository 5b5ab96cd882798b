"""A prebuilt mmcv with CUDA ops in the wheelhouse.

setup_env.sh describes each mmcv it builds with CUDA ops in a JSON file
next to the wheel (WHEEL.json, ``describe_wheel``): mmcv, PyTorch and CUDA
versions, TORCH_CUDA_ARCH_LIST, Python and platform tags. A side file
rather than a local version label (mmcv-2.1.0+cu130.sm90): renaming a
wheel means rewriting its metadata, and the description stays readable
and extensible. `make wheelhouse` copies the wheel with its description
into WHEELHOUSE/mmcv-cuda/<what it is for>/ (one folder per build: wheels
for other GPUs have the same file name), out of the wheelhouse's top
level that pip's --find-links reads, so that pip never picks one by
itself. On a node, setup_env.sh installs the first one whose description
matches (``prebuilt_mismatch``) and then runs ``check``.
"""
import csv
import glob
import json
import os
import os.path as osp
import re
import shutil
import sys
import zipfile
from typing import Dict, List, Optional, Sequence, Tuple

from . import SetupError
from .cuda import gpu_capabilities
from .pins import pinned_version, version_tuple

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
            version_tuple(present['glibc']) < version_tuple(built['glibc']):
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
