"""Running the README's tools in the tests: in a subprocess as a user does
(:func:`run_tool`), or in the test's own process, its state put back
afterwards (:func:`run_tool_here`), and a tool's functions without its
``main`` (:func:`load_tool`)."""
import contextlib
import gc
import importlib.util
import io
import multiprocessing
import os
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import mmengine.config  # noqa: F401  (its filters among a process's)
import torch  # noqa: F401

REPO = Path(__file__).resolve().parents[1]

#: the warning filters of a process started with this interpreter and the
#: packages imported above (conftest.py imports this module first): Python's
#: and the packages' own, without the 'always' pytest adds for deprecation
#: warnings
PROCESS_WARNING_FILTERS = [
    f for f in warnings.filters if not (
        f[0] == 'always' and f[1] is None and f[3] is None and
        f[2] in (DeprecationWarning, PendingDeprecationWarning))]


def _print_warning(message, category, filename, lineno, file=None,
                   line=None):
    """What Python prints for a warning, on the current ``sys.stderr``
    (pytest records warnings instead)."""
    sys.stderr.write(warnings.formatwarning(message, category, filename,
                                            lineno, line))


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


def load_tool(name: str):
    """``tools/<name>.py`` as a module, for its functions (its ``main`` is
    not run)."""
    spec = importlib.util.spec_from_file_location(
        name, REPO / 'tools' / f'{name}.py')
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def run_tool_here(script, *args, env=None, cwd=None):
    """A ``tools/*.py`` command run in this process: what ``run_tool``
    returns, without the 5 to 8 s of starting a Python with torch, mmdet
    and mmseg. Trainings, tests and demos run whole; warnings are printed
    on its stderr as a new process prints them (its filters, each 'once'
    warning once); what a run leaves in the process (mmengine's loggers,
    message hubs, visualizers and default scopes, threads, random states,
    signal handlers, environment, working directory, ``sys.path``) is put
    back afterwards. Commands whose process
    itself matters (signals, several processes, shell scripts) keep
    ``run_tool``."""
    argv = sys.argv
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with _process_state_restored():
        sys.argv = [str(script), *map(str, args)]
        os.environ.update(dict(PYTHON=sys.executable, **(env or {})))
        os.chdir(cwd or REPO)
        try:
            with contextlib.redirect_stdout(out), \
                    contextlib.redirect_stderr(err):
                runpy.run_path(str(REPO / script), run_name='__main__')
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(
                e.code is not None)
            if not isinstance(e.code, (int, type(None))):
                err.write(f'{e.code}\n')  # what the interpreter prints
        finally:
            sys.argv = argv
    return subprocess.CompletedProcess(sys.argv, code, out.getvalue(),
                                       err.getvalue())


@contextlib.contextmanager
def _process_state_restored():
    """Put back the process-wide state a tool's run changes."""
    import random
    import signal

    import cv2
    import numpy as np
    from mmengine.utils import ManagerMixin

    def managers(cls):
        for sub in cls.__subclasses__():
            if hasattr(sub, '_instance_dict'):
                yield sub
            yield from managers(sub)

    before = {cls: set(cls._instance_dict) for cls in managers(ManagerMixin)}
    environ, cwd, path = dict(os.environ), os.getcwd(), list(sys.path)
    handlers = {s: signal.getsignal(s) for s in (
        signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)}
    threads, cv2_threads = torch.get_num_threads(), cv2.getNumThreads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    rng = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    children = set(multiprocessing.active_children())
    once = dict(warnings.onceregistry)
    frozen = gc.get_freeze_count()
    try:
        with warnings.catch_warnings():
            warnings.filters[:] = PROCESS_WARNING_FILTERS
            warnings.showwarning = _print_warning
            warnings.onceregistry.clear()
            yield
    finally:
        warnings.onceregistry.clear()
        warnings.onceregistry.update(once)
        for cls in managers(ManagerMixin):
            for name in set(cls._instance_dict) - before.get(cls, set()):
                instance = cls._instance_dict.pop(name)
                for handler in getattr(instance, 'handlers', [])[:]:
                    handler.close()
                    instance.removeHandler(handler)
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        sys.path[:] = path
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        torch.set_num_threads(threads)
        cv2.setNumThreads(cv2_threads)
        torch.use_deterministic_algorithms(deterministic)
        torch.set_rng_state(rng[0])
        np.random.set_state(rng[1])
        random.setstate(rng[2])
        # the run's persistent dataloader workers end as at a process's exit
        # (their iterator's own shutdown waits 5 s for each)
        for child in set(multiprocessing.active_children()) - children:
            child.terminate()
            child.join()
        # a tool freezes what its process holds when it starts (run_cli):
        # this process's objects are collected again
        if not frozen:
            gc.unfreeze()
        # no gc.collect() here: a full collection in a process that holds
        # torch, mmdet and mmseg takes 0.5 s (a minute of the suite's 111
        # tool runs); Python's own collections free the run's cycles
