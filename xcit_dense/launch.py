"""PyTorch's torchrun as ``tools/torchrun.sh`` runs it, ended by a failed
process with that process's status and one line.

Run as a script by its path (``python xcit_dense/launch.py TORCHRUN_ARGS``):
it imports nothing of this package, so the launcher, which only starts and
watches the processes, does not pay for the package's models, timm and
mmengine's runner (a few seconds a launch). The processes it starts import
what they run.
"""
import os.path as osp
import sys
from typing import List

#: the exit status of a run that saved a checkpoint on a signal and stopped
#: (EX_TEMPFAIL of sysexits.h: try again, e.g. requeue and --resume)
EXIT_PREEMPTED = 75


def torchrun(argv: List[str]) -> None:
    """PyTorch's torchrun (``torch.distributed.run``) on ``argv``, ended by
    a failed process with that process's exit status and one line naming
    it, instead of torchrun's traceback and failure report: the process
    printed why (a tool's one paragraph, or its own traceback). A run whose
    processes saved a checkpoint on a signal ends with their status 75
    (:data:`EXIT_PREEMPTED`), which a scheduler's script can requeue, as
    ``tools/train.py`` alone does."""
    from torch.distributed.elastic.multiprocessing.errors import (
        ChildFailedError,
    )
    from torch.distributed.run import main
    try:
        main(argv)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        status = failure.exitcode
        if status < 0:  # killed by a signal
            print(f'error: process {rank} was killed by '
                  f'{failure.signal_name()} (the system\'s out-of-memory '
                  'killer sends SIGKILL); torchrun stopped the others.',
                  file=sys.stderr)
            sys.exit(128 - status)
        if status != EXIT_PREEMPTED:
            print(f'error: process {rank} exited with status {status} '
                  '(its output above says why); torchrun stopped the '
                  'others.', file=sys.stderr)
        sys.exit(status)


if __name__ == '__main__':
    # run by its path, Python put this package's folder first on the path,
    # where its modules (datasets, transforms, ...) would shadow others
    here = osp.dirname(osp.abspath(__file__))
    sys.path[:] = [p for p in sys.path if osp.abspath(p or '.') != here]
    torchrun(sys.argv[1:])
