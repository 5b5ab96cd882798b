"""The commands of ``tools/cuda_setup.py``, as ``setup_env.sh`` and
``make_wheelhouse.sh`` run them."""
import glob
import json
import os
import os.path as osp
import sys
from typing import Callable, Dict, Optional, Sequence, Tuple

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


def usage_problem(argv: Sequence[str]) -> Optional[str]:
    """What is wrong with a command line (one paragraph), None if
    nothing."""
    if not argv:
        return None
    command, args = argv[0], list(argv[1:])
    if command not in COMMANDS:
        return (f'unknown command {command!r}; the commands are '
                f'{", ".join(COMMANDS)} (python tools/cuda_setup.py alone '
                f'says what each does).')
    arguments = COMMANDS[command][0]
    usage = f'usage: python tools/cuda_setup.py {command} {arguments}'
    names = [n for n in arguments.split() if not n.startswith('[')]
    if command == 'venv' and args[1:] == ['--without-pip']:
        args = args[:1]
    if len(args) != len(names):
        got = f'got {" ".join(args)!r}' if args else 'got none'
        wanted = (f'{len(names)} argument{"s" if len(names) != 1 else ""} '
                  f'({", ".join(names)})' if names else 'no arguments')
        return f'{usage.rstrip()}: {command} takes {wanted}, {got}.'
    return None


def _plan(args: Sequence[str]) -> None:
    for key, value in plan(dict(os.environ)).items():
        print(f"{key}='{value}'")


def _cuda_home(args: Sequence[str]) -> None:
    import sysconfig
    site = sysconfig.get_paths()['purelib']
    dest = osp.join(sys.prefix, 'cuda')
    print(merge_cuda_home(registry_roots(site), dest))


def _check(args: Sequence[str]) -> None:
    check_ops()


def _torch(args: Sequence[str]) -> None:
    import torch
    note = check_torch(torch.__version__, osp.join(
        REPO, 'requirements', 'runtime.txt'))
    print(f'[setup_env] PyTorch {torch.__version__} in '
          f'{osp.dirname(osp.dirname(torch.__file__))}'
          + (f': {note}' if note else ''))


def _venv(args: Sequence[str]) -> None:
    for note in make_venv(args[0], with_pip=not args[1:]):
        print(f'[setup_env] {note}')


def _system_constraints(args: Sequence[str]) -> None:
    from importlib import metadata
    installed = {}
    for name in PINNED_AS_INSTALLED:
        try:
            installed[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed[name] = None
    try:
        with open(args[0]) as f:
            lines = system_torch_constraints(f.readlines(), installed)
    except OSError as err:
        raise SetupError(f'Cannot read the pins {args[0]} '
                         f'({err.strerror}).') from err
    try:
        with open(args[1], 'w') as f:
            f.write('\n'.join(lines) + '\n')
    except OSError as err:
        raise SetupError(f'Cannot write {args[1]} '
                         f'({err.strerror}).') from err


def _describe(args: Sequence[str]) -> None:
    if not osp.isfile(args[0]):
        raise SetupError(f'{args[0]}: no such file; describe takes '
                         f'the mmcv wheel a CUDA build made '
                         f'(mmcv-*.whl).')
    import torch
    built = describe_wheel(args[0], args[1], torch.__version__,
                           torch.version.cuda, glibc_version())
    with open(args[0] + '.json', 'w') as f:
        json.dump(built, f, indent=1)
    print(f'[setup_env] {args[0]}.json: {built}')


def _prebuilt(args: Sequence[str]) -> int:
    present = present_machine()
    wheel, notes = choose_prebuilt(args[0], present)
    if wheel is None:
        caps = ', '.join(sorted({'%d.%d' % c for c in
                                 present['capabilities']})) or 'none'
        print(f'[setup_env] no prebuilt mmcv in {args[0]} is for '
              f'PyTorch {present["torch"]}, CUDA {present["cuda"]}, '
              f'GPUs {caps}, {present["python"]} ('
              + ('; '.join(notes) or f'none below {PREBUILT_DIR}/')
              + '): building it', file=sys.stderr)
        return 1
    print(wheel)
    return 0


def _wheelhouse_mmcv(args: Sequence[str]) -> None:
    from importlib import metadata
    try:
        record = metadata.distribution('mmcv').read_text('RECORD')
    except metadata.PackageNotFoundError:
        record = None
    wheels = sorted(glob.glob(osp.join(
        REPO, 'build', 'mmcv-*', 'dist', 'mmcv-*.whl'))) + sorted(
        glob.glob(osp.join(args[0], '**', 'mmcv-*.whl'), recursive=True))
    _, note = add_to_wheelhouse(args[0], args[1], record or '', wheels)
    print(f'[wheelhouse] {note}')


#: each command's arguments, as the tool's docstring gives them, and its
#: function, given them; it returns its exit status (None: 0)
COMMANDS: Dict[str, Tuple[str, Callable[[Sequence[str]], Optional[int]]]] = {
    'plan': ('', _plan), 'cuda-home': ('', _cuda_home),
    'check': ('', _check), 'torch': ('', _torch),
    'venv': ('DEST [--without-pip]', _venv),
    'system-constraints': ('SRC DEST', _system_constraints),
    'describe': ('WHEEL ARCHS', _describe),
    'prebuilt': ('WHEELHOUSE', _prebuilt),
    'wheelhouse-mmcv': ('DEST PYTHON_VERSION', _wheelhouse_mmcv),
}


def main(argv: Sequence[str], usage: str) -> int:
    """Run the command line ``argv``; ``usage`` is printed without one."""
    problem = usage_problem(argv)
    if problem is not None:
        print(f'[setup_env] {problem}', file=sys.stderr)
        return 2
    if not argv:
        print(usage, file=sys.stderr)
        return 2
    try:
        return COMMANDS[argv[0]][1](argv[1:]) or 0
    except SetupError as err:
        print(f'[setup_env] {err}', file=sys.stderr)
        return 1
