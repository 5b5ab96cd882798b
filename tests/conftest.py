import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_tool(*args, cwd=None, env=None, timeout=600):
    """Run a command of the README (tools/*.py with this Python, or bash for
    tools/*.sh) and return the completed process."""
    cmd = [str(a) for a in args]
    if cmd[0].endswith('.py'):
        cmd = [sys.executable] + cmd
    elif cmd[0].endswith('.sh'):
        cmd = ['bash'] + cmd
    full_env = dict(os.environ, PYTHON=sys.executable, **(env or {}))
    return subprocess.run(cmd, cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def run_tool_here(script, *args, env=None):
    """A ``tools/*.py`` command run in this process, for the checks that end
    before any work starts (bad input): what ``run_tool`` returns, without
    the 8 s of starting a Python with torch, mmdet and mmseg."""
    import contextlib
    import io
    import runpy
    argv, environ, cwd = sys.argv, dict(os.environ), os.getcwd()
    sys.argv = [str(script), *map(str, args)]
    os.environ.update(env or {})
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        os.chdir(REPO)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(str(REPO / script), run_name='__main__')
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        sys.argv = argv
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
    return subprocess.CompletedProcess(sys.argv, code, out.getvalue(),
                                       err.getvalue())


@pytest.fixture(scope='session')
def tiny_coco(tmp_path_factory):
    """A small synthetic COCO dataset, made once per test session."""
    from xcit_dense.datasets.synthetic_coco import make_synthetic_coco
    root = tmp_path_factory.mktemp('synthetic_coco')
    make_synthetic_coco(str(root), num_train=8, num_val=4, seed=3)
    return root


@pytest.fixture(scope='session')
def tiny_ade20k(tmp_path_factory):
    """A small synthetic ADE20K-format dataset, made once per test session."""
    from xcit_dense.datasets.synthetic_ade20k import make_synthetic_ade20k
    root = tmp_path_factory.mktemp('synthetic_ade20k')
    make_synthetic_ade20k(str(root), num_train=8, num_val=4, seed=3)
    return root
