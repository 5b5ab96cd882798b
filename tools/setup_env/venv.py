"""A virtual environment over the PyTorch of a Python that may itself be a
virtual environment's (the offline set-up: ``WHEELHOUSE``,
``SYSTEM_TORCH``)."""
import json
import os.path as osp
import subprocess
import sys
from typing import List, Sequence

from . import SetupError

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
    notes = []
    if not osp.isfile(osp.join(dest, 'pyvenv.cfg')):
        notes.append(_create(dest, nested, with_pip))
    if nested:
        _see_outer_site(dest)
    return notes


def _create(dest: str, nested: bool, with_pip: bool) -> str:
    """The virtual environment at ``dest`` made by this Python (over its
    base installation's packages unless it is ``nested``, a virtual
    environment's itself); a log line."""
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
    return (f'created {dest} over {sys.executable} and its packages ' +
            (f'(a virtual environment\'s: {OUTER_SITE_PTH})' if nested
             else '(--system-site-packages)'))


def _see_outer_site(dest: str) -> None:
    """The environment at ``dest`` sees this Python's site-packages
    (:func:`site_dirs`) through ``OUTER_SITE_PTH``, checked by its own
    Python."""
    python = osp.join(dest, 'bin', 'python')
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
