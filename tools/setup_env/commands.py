"""The commands of ``tools/cuda_setup.py``, as ``setup_env.sh`` and
``make_wheelhouse.sh`` run them."""
import glob
import json
import os
import os.path as osp
import sys
from typing import Optional, Sequence

from . import REPO, SetupError
from .cuda import check_ops, merge_cuda_home, plan, registry_roots
from .pins import PINNED_AS_INSTALLED, check_torch, system_torch_constraints
from .prebuilt import (
    PREBUILT_DIR,
    add_to_wheelhouse,
    choose_prebuilt,
    describe_wheel,
    glibc_version,
    present_machine,
)
from .venv import make_venv

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


def main(argv: Sequence[str], usage: str) -> int:
    """Run the command line ``argv``; ``usage`` is printed without one."""
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
            print(usage, file=sys.stderr)
            return 2
    except SetupError as err:
        print(f'[setup_env] {err}', file=sys.stderr)
        return 1
    return 0
