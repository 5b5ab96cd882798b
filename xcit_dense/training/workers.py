"""DataLoader workers that outlive a stop signal sent to the whole job.

Schedulers stop a job by sending SIGTERM to every one of its processes
(SLURM's ``scancel`` and pre-emption, torchrun passing its own SIGTERM on to
each rank's process group), dataloader workers included. PyTorch's worker
exits quietly on a SIGTERM from its parent (the DataLoader shutting it down)
and dies on any other; its parent's DataLoader then raises "DataLoader
worker ... is killed by signal: Terminated" in the middle of the iteration,
before :class:`~xcit_dense.hooks.PreemptionHook` can finish it and save. A
worker started with :class:`StopSignalTolerant` tells the two apart as
PyTorch does (by the sender's process id) and ignores the job's SIGTERM:
the training process decides when to stop and shuts its workers down as
usual.
"""
import os
import signal
import threading
from typing import Callable, Optional


class StopSignalTolerant:
    """A DataLoader ``worker_init_fn``: SIGTERM is blocked in the worker and
    a thread waits for it; one from the worker's parent exits the worker
    quietly (PyTorch's own handling), any other is ignored. Then the
    DataLoader's own ``init_fn``, if any, runs."""

    def __init__(self, init_fn: Optional[Callable[[int], None]] = None):
        self.init_fn = init_fn

    def __call__(self, worker_id: int) -> None:
        parent = os.getppid()
        # before the worker starts threads of its own: they inherit the mask
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

        def wait() -> None:
            while True:
                if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
                    os._exit(0)

        threading.Thread(target=wait, name='sigterm-from-parent',
                         daemon=True).start()
        if self.init_fn is not None:
            self.init_fn(worker_id)


def tolerate_stop_signal(dataloader) -> None:
    """Start ``dataloader``'s future workers with :class:`StopSignalTolerant`
    around its ``worker_init_fn`` (once; a loader without worker processes
    is left as it is)."""
    init_fn = getattr(dataloader, 'worker_init_fn', None)
    if getattr(dataloader, 'num_workers', 0) and \
            not isinstance(init_fn, StopSignalTolerant):
        dataloader.worker_init_fn = StopSignalTolerant(init_fn)
