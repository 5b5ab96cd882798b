"""Running measurements, each in a fresh process (so that its peak memory
is its own) or, with ``--in-process``, one after another in this one, and
combining interleaved rounds."""
import argparse
import json
import os
import signal
import subprocess
import sys

from .names import REPO, RUNTIMES, parse_model

_EXPORTED = {}  # (base, size, batch) -> the export's row


def run_measurement(model, size, batch, mode, args) -> dict:
    """One row: ``model`` at ``size``, ``batch``, ``mode`` measured in a fresh
    process (runtimes: after an export in a process of its own), or in this
    one with ``args.in_process``."""
    base, variants = parse_model(model)
    if set(variants) & set(RUNTIMES) and mode == 'infer':
        # exported (and verified) in a process of its own, so that the
        # runtime's process holds only what the runtime needs; once per
        # model, size and batch for all runtimes and rounds; an INT8 model
        # is quantized from that fp32 export
        exported = _export(model, base, size, batch, args)
        if 'int8' in variants and 'error' not in exported:
            exported = _export(model, base, size, batch, args, int8=True)
        if 'error' in exported:
            return dict(exported, model=model)
        row = _run(model, size, batch, mode, args)
        row.update({k: exported[k] for k in ('export_s',
                                             'export_max_rel_diff')})
        return row
    return _run(model, size, batch, mode, args)


def _export(model, base, size, batch, args, int8=False) -> dict:
    """The export row of ``base`` at ``size`` and ``batch`` (fp32, or its
    INT8 quantization), made once per run."""
    key = (args.out_dir, base, size, batch, int8)
    if key not in _EXPORTED:
        _EXPORTED[key] = _run(model if int8 else base, size, batch, 'export',
                              args)
    return _EXPORTED[key]


def _run(model, size, batch, mode, args) -> dict:
    """One measurement, where ``args`` says."""
    if getattr(args, 'in_process', False):
        return _run_here(model, size, batch, mode, args)
    return _run_worker(model, size, batch, mode, args)


def _run_here(model, size, batch, mode, args) -> dict:
    """Run :func:`.measure.measure_here` in this process, with the options a
    fresh process would be given (no time limit); the row as a fresh
    process writes it (through JSON), a failure a row with ``error``."""
    from .measure import measure_here
    worker = argparse.Namespace(
        model=model, size=tuple(size), batch=batch, mode=mode,
        device=args.device, threads=args.threads, repeat=args.repeat,
        warmup=args.warmup, out_dir=args.out_dir, in_process=True,
        published_code=getattr(args, 'published_code', None))
    try:
        return json.loads(json.dumps(measure_here(worker)))
    except Exception as error:  # a failed row, as a failed process's
        return dict(model=model, h=size[0], w=size[1], batch=batch,
                    mode=mode, error=failure_reason(
                        1, f'{type(error).__name__}: {error}'))


def _run_worker(model, size, batch, mode, args) -> dict:
    """Run :mod:`.measure` in a fresh process; a failure is a row with
    ``error``."""
    cmd = [sys.executable, '-m', 'benchmarks.harness.measure',
           '--model', model, '--size', f'{size[0]}x{size[1]}',
           '--batch', str(batch), '--mode', mode, '--device', args.device,
           '--threads', str(args.threads), '--repeat', str(args.repeat),
           '--warmup', str(args.warmup), '--out-dir', args.out_dir]
    if getattr(args, 'published_code', None):
        cmd += ['--published-code', args.published_code]
    path = os.pathsep.join(filter(None, [REPO,
                                        os.environ.get('PYTHONPATH')]))
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
               PYTHONPATH=path)
    stub = dict(model=model, h=size[0], w=size[1], batch=batch, mode=mode)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return dict(stub, error=f'timeout ({args.timeout:g} s)')
    if proc.returncode != 0:
        return dict(stub, error=failure_reason(proc.returncode, proc.stderr))
    lines = proc.stdout.strip().splitlines()
    if not lines:
        return dict(stub, error='the measurement wrote no row')
    return json.loads(lines[-1])


def failure_reason(returncode: int, stderr: str) -> str:
    """One line for a measurement's failed process: out of memory where it
    says so, the signal that killed it (a crash in a kernel or the driver
    is SIGSEGV or SIGABRT, not memory; the kernel's out-of-memory killer
    sends SIGKILL), else its last line of error output."""
    if 'MemoryError' in stderr or 'out of memory' in stderr:
        return 'out of memory'
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f'signal {-returncode}'
        return f'killed by {name}' + (
            ' (out of memory?)' if -returncode == signal.SIGKILL else '')
    return (stderr.strip().splitlines() or ['failed'])[-1]


def combine(rounds):
    """One row from the rounds of a measurement: the round with the median
    time (a failed round only if every round failed), with every round's
    time in round order (``round_seconds``, None for a failed round)."""
    ok = sorted((r for r in rounds if 'error' not in r),
                key=lambda r: r['seconds'])
    if not ok:
        return rounds[-1]
    row = dict(ok[(len(ok) - 1) // 2])
    row['rounds'] = len(ok)
    row['round_seconds'] = [r.get('seconds') for r in rounds]
    return row
