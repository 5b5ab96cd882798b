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
