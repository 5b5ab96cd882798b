"""The library of ``tools/setup_env.sh``, whose steps run it through
``tools/cuda_setup.py``: the GPUs and the CUDA compiler (:mod:`.cuda`), the
PyTorch an offline set-up accepts and the pins it installs with
(:mod:`.pins`), a virtual environment over a virtual environment's Python
(:mod:`.venv`), prebuilt mmcv wheels with CUDA ops (:mod:`.prebuilt`) and
the commands (:mod:`.commands`).

It runs before the package's dependencies are installed, by the Python the
environment is made from, on the standard library and PyTorch alone, and it
reads the repository's ``requirements/`` and ``build/``: so it lives beside
the set-up's scripts, not in ``xcit_dense/`` (whose import brings mmengine
and timm), as PyTorch keeps its build's library in ``tools/setup_helpers/``.
Every decision is a function of its inputs, tested on the CPU
(tests/test_cuda_setup.py).
"""
import os.path as osp

#: the repository, whose requirements/ and build/ the set-up reads
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


class SetupError(Exception):
    """What is missing, and how to provide it (one paragraph)."""
