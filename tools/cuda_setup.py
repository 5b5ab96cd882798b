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
Every decision is a function of its inputs (``tools/setup_env/``), tested
on the CPU (tests/test_cuda_setup.py).
"""
import os.path as osp
import sys
from typing import Sequence

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

from setup_env import commands  # noqa: E402


def main(argv: Sequence[str]) -> int:
    return commands.main(argv, __doc__)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
