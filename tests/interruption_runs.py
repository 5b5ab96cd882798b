"""How the interruption tests start, signal and compare training runs.

The runs that a test signals are processes of their own forked from one
that has imported what ``tools/train.py`` and the demo configs import (and
``conftest``, so with the config caches ``run_tool_here``'s runs have),
without the 4 to 5 s of starting a Python with torch, mmdet and mmseg each
time. Run as a script this module is that server: it reads JSON lines from
stdin, each a list of jobs (argv, environment, working directory, log file),
forks one process per job (its own session, stdout and stderr to the log,
stdin from /dev/null, ``argv[0]`` run as ``__main__``), writes their pids as
a line, then their exit statuses (negative: the signal) once all have
ended. Nothing it imports starts a thread, so forking is safe.
:class:`ForkServer` is the tests' end of it."""
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

import torch

from conftest import REPO

#: what a training run of the demo configs imports
PRELOAD = ('xcit_dense.cli', 'xcit_dense.runner', 'xcit_dense.preflight',
           'xcit_dense.launch', 'xcit_dense.tta', 'mmdet.models',
           'mmdet.datasets', 'mmdet.evaluation', 'mmdet.engine',
           'mmdet.visualization', 'mmengine.runner')


def _become(job):
    """In the forked child: the process ``python ARGV`` would be."""
    os.setsid()  # its own process group, as the tests start runs
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(job['log'], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    os.environ.clear()
    os.environ.update(job['env'])
    os.chdir(job['cwd'])
    script = job['argv'][0]
    sys.argv = list(job['argv'])
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    import runpy
    runpy.run_path(script, run_name='__main__')
    sys.exit(0)


def serve():
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)
    # one thread: a fork copies no lock another thread holds
    assert os.listdir('/proc/self/task') == [str(os.getpid())]
    for line in sys.stdin:
        pids = []
        for job in json.loads(line):
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _become(job)  # ends as the run's process ends
            pids.append(pid)
        print(json.dumps(pids), flush=True)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                 for pid in pids]
        print(json.dumps(codes), flush=True)


class ForkServer:
    """The server, started once. :meth:`start` forks a batch of jobs (one
    batch at a time) and returns a handle to them as ``subprocess.Popen``
    is one: ``pid`` (the first job's), ``poll()`` and ``wait(timeout)``
    (the first job's exit status; ``codes``: all of them)."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, __file__], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, bufsize=0,  # select sees every line
            cwd=os.path.dirname(__file__))
        self.codes = None

    def start(self, jobs):
        """Fork ``jobs``: dicts of argv, env, cwd and log (once the jobs
        before them have ended)."""
        if getattr(self, 'pids', None) and self.codes is None:
            self.wait(600)  # a failed test's runs
        self.codes = None
        self.proc.stdin.write(json.dumps(jobs).encode() + b'\n')
        self.pids = json.loads(self._line(None))
        self.pid = self.pids[0]
        return self

    def _line(self, timeout):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        assert line, f'the fork server ended ({self.proc.wait()})'
        return line

    def poll(self):
        if self.codes is None:
            line = self._line(0)
            self.codes = line and json.loads(line)
        return self.codes and self.codes[0]

    def wait(self, timeout):
        if self.codes is None:
            line = self._line(timeout)
            assert line, f'the forked runs ran past {timeout} s'
            self.codes = json.loads(line)
        return self.codes[0]

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a failed test's run hangs
            self.proc.kill()
            self.proc.wait()


def _job(argv, log, **env):
    """A job for :class:`ForkServer`: ``python ARGV`` in the repository
    with this environment and ``env``, its output to ``log``."""
    log.write_text('')
    return dict(argv=[str(a) for a in argv], log=str(log), cwd=str(REPO),
                env=dict(os.environ, PYTHON=sys.executable, **env))


def forked(forks, config, work, *args):
    """``tools/train.py CONFIG --work-dir WORK ARGS`` in a process forked
    from ``forks``: a ``start`` for :func:`interrupt`."""
    return lambda log: forks.start([_job(
        ['tools/train.py', config, '--work-dir', work, *args], log)])


def launched(command):
    """``command`` as a new process: a ``start`` for :func:`interrupt`."""
    def start(log):
        with open(log, 'w') as out:
            return subprocess.Popen(
                command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                env=dict(os.environ, PYTHON=sys.executable),
                start_new_session=True)
    return start


def interrupt(start, log, pattern, signum, pids=None, group=False):
    """Start a run with ``start(log)`` (a process of a session of its own,
    its output to ``log``), send ``signum`` once its log matches
    ``pattern`` (to ``pids(process)`` if given; to every process it
    started, dataloader workers included, with ``group``, as schedulers
    do), return its exit status and log."""
    proc = start(log)
    deadline = time.time() + 300
    while not re.search(pattern, log.read_text()):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.time() < deadline, 'the pattern never appeared'
        time.sleep(0.05)
    if group:
        os.killpg(proc.pid, signum)
    else:
        for pid in (pids(proc) if pids else [proc.pid]):
            os.kill(pid, signum)
    code = proc.wait(timeout=300)
    if signum == signal.SIGKILL:  # its workers too
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return code, log.read_text()


def assert_same_state(a, b):
    """Checkpoints ``a`` and ``b``: the same iteration, weights, optimizer
    moments, schedulers and last logged losses and lr, bit for bit."""
    import xcit_dense  # noqa: F401  (allow-lists mmengine's types)
    a = torch.load(a, weights_only=True)
    b = torch.load(b, weights_only=True)
    assert a['meta']['iter'] == b['meta']['iter']
    assert a['state_dict'].keys() == b['state_dict'].keys()
    for key, value in a['state_dict'].items():
        assert torch.equal(value, b['state_dict'][key]), key
    sa, sb = a['optimizer']['state'], b['optimizer']['state']
    assert sa.keys() == sb.keys() and len(sa) > 0
    for k in sa:
        for name in ('exp_avg', 'exp_avg_sq'):
            assert torch.equal(sa[k][name], sb[k][name]), (k, name)
    assert a['param_schedulers'] == b['param_schedulers']
    # the logged metrics of the last iteration
    hub_a, hub_b = a['message_hub']['log_scalars'], b['message_hub'][
        'log_scalars']
    for key in ('train/loss', 'train/loss_mask', 'train/lr'):
        assert hub_a[key].current() == hub_b[key].current(), key


def ranks(forks, log, *argv):
    """``tools/train.py ARGV --launcher pytorch`` in two processes forked
    from ``forks``, with the environment torchrun gives its processes;
    their output."""
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    world = dict(WORLD_SIZE='2', LOCAL_WORLD_SIZE='2', MASTER_PORT=str(port),
                 MASTER_ADDR='127.0.0.1',
                 OMP_NUM_THREADS=os.environ.get('OMP_NUM_THREADS', '1'))
    forks.start([_job(['tools/train.py', *argv, '--launcher', 'pytorch'],
                      log.with_suffix(f'.{rank}.log'), RANK=str(rank),
                      LOCAL_RANK=str(rank), **world) for rank in (0, 1)])
    forks.wait(timeout=600)
    out = ''.join(log.with_suffix(f'.{rank}.log').read_text()
                  for rank in (0, 1))
    assert forks.codes == [0, 0], out[-3000:]
    return out


if __name__ == '__main__':
    serve()
    os._exit(0)  # stdin closed: no run left; torch's teardown skipped
