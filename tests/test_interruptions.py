"""Interruption-proof training on the COCO demo loops: a run killed at any
iteration (SIGKILL) or stopped by a signal (SIGTERM: a checkpoint of the
iteration in flight) and resumed with --resume ends with the same weights and
optimizer state as the uninterrupted run, bit for bit, with dataloader
workers and random augmentation; checkpoints are whole or absent; a
truncated newest checkpoint is skipped and named."""
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import REPO
from interruption_runs import (
    ForkServer,
    assert_same_state,
    forked,
    interrupt,
    launched,
    ranks,
)
from shrink import NARROW_MASK_RCNN
from tool_runs import run_tool, run_tool_here

DEMO = REPO / 'configs' / 'coco' / 'demo_mask_rcnn_xcit_nano_synthetic.py'


def _config(tmp_path, data_root, loop, workers=2):
    """The demo on the tiny dataset (depth 4, FPN and heads 32 wide):
    dataloader workers, random flip, drop path; 6 iterations in one pass
    (iteration loop) or 2 epochs of 4 (epoch loop), checkpoints every 2
    iterations. A finite sampler in both: the iteration loop restarts it
    after 4 iterations, as in iteration-based recipes with mmdet's
    DefaultSampler (Mask2Former's). No validation: no check reads it."""
    root = f'{data_root}/'
    train_cfg = (
        "dict(max_iters=6, val_interval=100, val_begin=100)" if loop == 'iter'
        else "dict(_delete_=True, type='xcit_dense.EpochBasedTrainLoop', "
        "max_epochs=2, val_interval=100, val_begin=100)")
    path = tmp_path / f'{loop}.py'
    path.write_text(f"""
_base_ = '{DEMO}'
model = dict(backbone=dict(depth=4, out_indices=(0, 1, 2, 3),
                           drop_path_rate=0.1),
             {NARROW_MASK_RCNN})
train_dataloader = dict(batch_size=2, num_workers={workers},
                        persistent_workers={workers > 0},
                        sampler=dict(type='DefaultSampler', shuffle=True),
                        dataset=dict(data_root='{root}'))
val_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root='{root}'))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file='{root}annotations/val.json')
test_evaluator = val_evaluator
train_cfg = {train_cfg}
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False,
                        begin=0, end=3)]
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(by_epoch=False, interval=2,
                                     max_keep_ckpts=10))
log_processor = dict(by_epoch={loop == 'epoch'})
""")
    return path


def _train(config, work, *args):
    proc = run_tool_here('tools/train.py', config, '--work-dir', work, *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.fixture(scope='module')
def forks():
    """Training processes forked from a process that has imported what a
    run imports (each test's runs one after the other)."""
    server = ForkServer()
    yield server
    server.close()


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory, tiny_coco):
    """Uninterrupted runs of both loops: config and work dir by loop."""
    runs = {}
    for loop in ('iter', 'epoch'):
        tmp = tmp_path_factory.mktemp(f'uninterrupted_{loop}')
        config = _config(tmp, tiny_coco, loop)
        _train(config, tmp / 'work')
        runs[loop] = config, tmp / 'work'
    return runs


def test_iteration_loop_sigkill_then_resume_is_exact(forks, uninterrupted,
                                                      tmp_path):
    config, reference = uninterrupted['iter']
    work = tmp_path / 'work'
    # killed during iteration 5; checkpoints at 2 and 4
    code, _ = interrupt(
        forked(forks, config, work), tmp_path / 'killed.log',
        r'Iter\(train\) \[5/6\]', signal.SIGKILL)
    assert code == -signal.SIGKILL
    # and the newest checkpoint truncated, as a crash mid-write of a tool
    # without atomic writes would leave it
    newest = work / 'iter_4.pth'
    newest.write_bytes(newest.read_bytes()[:1000])
    log = _train(config, work, '--resume')
    assert re.search(r'The newest checkpoint .*iter_4\.pth cannot be read '
                     r'.*; resuming from .*iter_2\.pth, the newest complete '
                     'one', log)
    assert 'resumed epoch: 0, iter: 2' in log
    assert 'Reach the end of the dataloader' in log  # restarted after 4
    assert_same_state(reference / 'iter_6.pth', work / 'iter_6.pth')


def test_launcher_names_a_bad_count_and_a_busy_port(tmp_path):
    """``dist_train.sh`` / ``dist_test.sh``: no count, 0, or a flag where the
    count goes, and a port another process listens on, are one line each
    before torchrun starts (its tracebacks: 'Unsupported nproc_per_node
    value', a bare AssertionError, EADDRINUSE)."""
    import socket
    for args in [('x.py', '0'), ('x.py', '00'), ('x.py', '--work-dir')]:
        proc = run_tool('tools/dist_train.sh', *args)
        assert proc.returncode == 2 and 'Traceback' not in proc.stderr
        assert 'must be a positive integer' in proc.stderr, proc.stderr
    proc = run_tool('tools/dist_test.sh', 'x.py', 'x.pth', 'two')
    assert "must be a positive integer; got 'two'" in proc.stderr
    for tool, args, usage in [
            ('dist_train.sh', ['x.py'], 'CONFIG GPUS [ARGS]'),
            ('dist_test.sh', ['x.py', '2'], 'CONFIG CHECKPOINT GPUS [ARGS]'),
            ('slurm_train.sh', ['p', 'job', 'x.py'],
             'PARTITION JOB_NAME CONFIG WORK_DIR [ARGS]'),
            ('slurm_test.sh', [], 'PARTITION JOB_NAME CONFIG CHECKPOINT')]:
        proc = run_tool(f'tools/{tool}', *args)
        assert proc.returncode == 2 and proc.stderr.startswith('error: ')
        assert usage in proc.stderr and \
            f'got {len(args)} argument(s)' in proc.stderr, proc.stderr
    proc = run_tool('tools/slurm_test.sh', 'p', 'job', 'x.py', 'x.pth',
                    env=dict(GPUS='abc'))
    assert proc.returncode == 2
    assert proc.stderr == "error: GPUS must be a positive integer; got " \
        "'abc'.\n"
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_tool('tools/dist_train.sh', 'x.py', '2',
                        env=dict(PORT=str(port)))
    assert proc.returncode == 2 and 'Traceback' not in proc.stderr
    assert f'error: port {port} on 127.0.0.1' in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize('status', [1, 75])
def test_a_failed_process_ends_the_launcher_with_its_status(tmp_path,
                                                            status):
    """``tools/torchrun.sh``'s torchrun (``xcit_dense/launch.py``): a
    process that fails (here: rank 1 of 2, after its own message) ends the
    launcher with its status and one line naming it, not torchrun's
    ChildFailedError traceback and failure report; the status 75 of a run
    pre-empted with a checkpoint is passed on as it is, for a scheduler to
    requeue."""
    launcher = REPO / 'xcit_dense' / 'launch.py'
    worker = tmp_path / 'worker.py'
    worker.write_text(
        'import os, sys\n'
        'if os.environ["RANK"] == "1":\n'
        f'    print("error: the worker\'s own message", file=sys.stderr)\n'
        f'    sys.exit({status})\n')
    proc = run_tool_here(launcher, '--nproc_per_node=2', '--master_port=0',
                         '--monitor_interval=0.05', worker)
    assert proc.returncode == status
    assert 'Traceback' not in proc.stderr, proc.stderr
    assert 'ChildFailedError' not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1:] if proc.stderr.strip() \
        else []
    if status == 75:
        assert not any(line.startswith('error:') for line in last), last
    else:
        assert last == ['error: process 1 exited with status 1 (its output '
                        'above says why); torchrun stopped the others.']


def test_epoch_resumed_where_an_epoch_has_other_iterations(uninterrupted,
                                                           tmp_path):
    """A checkpoint of the epoch loop resumed where an epoch has another
    number of iterations (the batch size doubled here; another number of
    processes likewise): in the middle of an epoch it continues after
    about the same share of the epoch's samples, said in the log; at an
    epoch's end the next epoch starts; the run ends (it failed with
    StopIteration, or trained an epoch of nothing)."""
    import shutil
    config, work = uninterrupted['epoch']
    for saved, message in [
            (2, "Resuming epoch 1 after iteration 2 of 4, and this run's "
                'epoch has 2 iterations (the number of processes or the '
                'batch size changed): it continues after iteration 1 of 2'),
            (4, None)]:
        resumed = tmp_path / f'resumed_{saved}'
        resumed.mkdir()
        shutil.copy(work / f'iter_{saved}.pth', resumed)
        log = _train(config, resumed, '--resume', '--cfg-options',
                     'train_dataloader.batch_size=4')
        assert f'resumed epoch: 0, iter: {saved}' in log
        assert (message in log) if message else 'Resuming epoch' not in log
        first = re.findall(r'Epoch\(train\) \[1\]\[(\d+)/2\]', log)
        assert first == (['2'] if message else []), first
        assert re.findall(r'Epoch\(train\) \[2\]\[(\d+)/2\]', log) == \
            ['1', '2']


def test_epoch_loop_sigterm_then_sigkill_then_resume_is_exact(uninterrupted,
                                                               forks,
                                                               tmp_path):
    config, reference = uninterrupted['epoch']
    work = tmp_path / 'work'
    # SIGTERM in epoch 1, to every process of the run as a scheduler sends
    # it (the dataloader workers carry on until the training process shuts
    # them down): a checkpoint of the iteration in flight, status 75
    code, log = interrupt(forked(forks, config, work),
                          tmp_path / 'term.log',
                          r'Epoch\(train\) \[1\]\[3/4\]', signal.SIGTERM,
                          group=True)
    assert code == 75, log[-3000:]
    m = re.search(r'SIGTERM received: saved the state after iteration (\d+) '
                  r'to (\S+) and stopping \(exit status 75\)', log)
    assert m, log[-3000:]
    done = int(m.group(1))
    assert done in (3, 4)  # the iteration in flight when the signal came
    assert (work / 'last_checkpoint').read_text().endswith(
        f'iter_{done}.pth')
    # resumed there, then killed in the middle of epoch 2 (after the
    # checkpoint of iteration 6)
    code, log = interrupt(forked(forks, config, work, '--resume'),
                          tmp_path / 'killed.log',
                          r'Epoch\(train\) \[2\]\[3/4\]', signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert f'resumed epoch: 0, iter: {done}' in log
    log = _train(config, work, '--resume')
    assert 'resumed epoch: 1, iter: 6' in log  # mid-epoch
    assert_same_state(reference / 'iter_8.pth', work / 'iter_8.pth')


def _assert_two_processes(out):
    """What each of two processes of the GPU recipe says on a CPU."""
    assert out.count('No GPU: fp32 training') == 2  # one per process
    assert 'BatchNorm instead of SyncBN' in out
    assert 'Distributed launcher: pytorch' in out
    assert 'GPU number: 2' in out  # mmengine's name for the world size


def test_two_processes_stop_together_and_resume_exactly(tiny_coco, forks,
                                                        tmp_path):
    # the GPU recipe's AMP and SyncBN, which a CPU cannot run, and the
    # endless sampler of the demos and the ADE20K recipes; 4 iterations.
    # The reference and the resumed runs: two processes forked with
    # torchrun's environment; the interrupted one: tools/dist_train.sh's
    config = _config(tmp_path, tiny_coco, 'iter', workers=0)
    with open(config, 'a') as f:
        f.write("optim_wrapper = dict(type='AmpOptimWrapper')\n"
                "sync_bn = 'torch'\n"
                "train_cfg.update(max_iters=4)\n"
                "train_dataloader.update(\n"
                "    sampler=dict(type='InfiniteSampler', shuffle=True))\n")
    out = ranks(forks, tmp_path / 'reference', config, '--work-dir',
                tmp_path / 'reference')
    _assert_two_processes(out)
    assert 'Reach the end of the dataloader' not in out  # endless
    # LPI's channels-last convolutions hand DDP its gradients in the
    # parameters' own strides (else DDP copies them every step, and warns)
    assert 'Grad strides do not match bucket view strides' not in out
    work = tmp_path / 'work'

    def rank1(proc):  # the signal reaches one rank only
        found, todo = [], [proc.pid]
        while todo:  # the process tree under dist_train.sh
            children = subprocess.run(['pgrep', '-P', str(todo.pop())],
                                      capture_output=True, text=True)
            for pid in map(int, children.stdout.split()):
                with open(f'/proc/{pid}/environ', 'rb') as f:
                    if b'\0RANK=1\0' in b'\0' + f.read():
                        found.append(pid)  # not its dataloader workers
                    else:
                        todo.append(pid)
        assert len(found) == 1, found
        return found

    code, log = interrupt(
        launched(['bash', 'tools/dist_train.sh', str(config), '2',
                   '--work-dir', str(work)]), tmp_path / 'term.log',
        r'Iter\(train\) \[2/4\]', signal.SIGTERM, pids=rank1)
    assert code == 75  # the workers' status, for a scheduler to requeue
    done = {int(n) for n in re.findall(
        r'SIGTERM received: saved the state after iteration (\d+)', log)}
    assert len(done) == 1, log[-3000:]  # both ranks stopped at the same one
    done = done.pop()
    assert done in (2, 3)  # the iteration in flight: 4 is left to resume
    assert 'Traceback' not in log and 'ChildFailedError' not in log
    assert (work / f'iter_{done}.pth').is_file()
    # resumed as the reference ran (the launcher's part is checked above)
    out = ranks(forks, tmp_path / 'resumed', config, '--work-dir', work,
                '--resume')
    _assert_two_processes(out)
    assert f'resumed epoch: 0, iter: {done}' in out  # not begun anew
    assert_same_state(tmp_path / 'reference' / 'iter_4.pth',
                      work / 'iter_4.pth')


def test_atomic_writes_leave_the_old_file(tmp_path, monkeypatch):
    from xcit_dense.training import AtomicLocalBackend
    backend = AtomicLocalBackend()
    path = tmp_path / 'iter_2.pth'
    backend.put(b'complete', path)
    # readable as any new file (not mkstemp's owner-only mode)
    from xcit_dense.atomic_files import new_file_mode
    assert path.stat().st_mode & 0o777 == new_file_mode()

    def crash(src, dst):
        raise KeyboardInterrupt  # killed between writing and renaming

    monkeypatch.setattr(os, 'replace', crash)
    with pytest.raises(KeyboardInterrupt):
        backend.put(b'half', path)
    assert path.read_bytes() == b'complete'
    assert os.listdir(tmp_path) == ['iter_2.pth']  # no temporary left


def test_required_hooks_added_to_any_config():
    from mmengine.config import ConfigDict

    from xcit_dense.runner import add_required_hooks
    cfg = ConfigDict(custom_hooks=[dict(type='EMAHook')],
                     default_hooks=dict(checkpoint=dict(interval=5)))
    add_required_hooks(cfg)
    assert [h['type'] for h in cfg.custom_hooks] == [
        'EMAHook', 'xcit_dense.CheckpointImportHook',
        'xcit_dense.PreemptionHook']
    assert cfg.default_hooks.checkpoint.backend_args == dict(
        backend='atomic_local')


def test_slurm_script_asks_for_the_signal_and_requeues(tmp_path):
    """tools/slurm_train.sh with stand-ins for srun and scontrol: srun gets
    --signal=USR1@120 and --resume; status 75 inside a batch job requeues
    it."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'srun').write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/srun_args\nexit 75\n')
    (bin_dir / 'scontrol').write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/scontrol_args\n')
    for tool in ('srun', 'scontrol'):
        (bin_dir / tool).chmod(0o755)
    env = dict(PATH=f'{bin_dir}:{os.environ["PATH"]}', SLURM_JOB_ID='4242',
               GPUS='2', GPUS_PER_NODE='2')
    proc = run_tool('tools/slurm_train.sh', 'gpu', 'xcit', 'cfg.py', 'work',
                    env=env)
    assert proc.returncode == 75
    srun = (tmp_path / 'srun_args').read_text()
    assert '--signal=USR1@120' in srun
    assert re.search(r'tools/train\.py cfg\.py --work-dir=work --resume '
                     r'--launcher=slurm', srun), srun
    assert (tmp_path / 'scontrol_args').read_text().split() == [
        'requeue', '4242']


def test_training_loader_workers_outlive_a_stop_signal_to_the_job(
        tiny_coco, tmp_path):
    """The resumable loops' training loader starts its workers with
    ``StopSignalTolerant`` from its first iterator on (mmengine's iteration
    loop creates it in its constructor, before any hook runs): a worker of
    the demo's loader signalled by another process still loads the next
    batch."""
    from types import SimpleNamespace

    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmengine.runner import Runner

    from xcit_dense.training.loops import resumable_dataloader
    cfg = Config.fromfile(_config(tmp_path, tiny_coco, 'iter', workers=1))
    runner = SimpleNamespace(seed=0, _randomness_cfg={},
                             build_dataloader=Runner.build_dataloader)
    with DefaultScope.overwrite_default_scope('mmdet'):
        loader = resumable_dataloader(runner, cfg.train_dataloader)
        iterator = iter(loader)
        next(iterator)
        worker = iterator._workers[0]
        subprocess.run(['kill', '-TERM', str(worker.pid)], check=True)
        time.sleep(0.5)
        assert next(iterator)['inputs'][0].shape[0] == 3
        assert worker.is_alive()


def test_workers_ignore_a_stop_signal_from_elsewhere_only():
    """A dataloader worker started with ``StopSignalTolerant`` carries on
    after a SIGTERM from another process (the job's, which PyTorch's worker
    dies of), and exits quietly on one from its parent (the DataLoader
    shutting it down, as PyTorch's does)."""
    from torch.utils.data import DataLoader

    from xcit_dense.training.workers import tolerate_stop_signal
    loader = DataLoader(list(range(6)), batch_size=1, num_workers=1,
                        persistent_workers=True)
    tolerate_stop_signal(loader)
    iterator = iter(loader)
    assert next(iterator).item() == 0
    worker = iterator._workers[0]
    subprocess.run(['kill', '-TERM', str(worker.pid)], check=True)
    time.sleep(0.5)
    assert [batch.item() for batch in iterator] == [1, 2, 3, 4, 5]
    assert worker.is_alive()
    os.kill(worker.pid, signal.SIGTERM)  # from the parent
    worker.join(timeout=10)
    assert worker.exitcode == 0
