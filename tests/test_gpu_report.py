"""``make gpu-report``'s plumbing, on the CPU: its steps exist and each
runs what it says, and the README's GPU table is generated from the steps'
rows (the measurements themselves need a GPU: tests/test_cuda.py)."""
import json
import os
import re
import subprocess

import pytest

from conftest import REPO
from tool_runs import run_tool_here

STEPS = {
    'tests': ('timeout -k 30 -s INT 480 python -m pytest',
              'tests/test_cuda.py -n 4 --dist worksteal'),
    'probe': ('-m benchmarks.gpu.policy_probe', '--graphs',
              '-m benchmarks.gpu.launch_probe', '--no-compile',
              '-m benchmarks.probes.host_time --device cuda'),
    'tiles': ('-m benchmarks.gpu.tile_sweep', ),
    'backbone': ('xcit_small_12_p16@reference',
                 'xcit_small_12_p16@amp', 'xcit_small_12_p16@bf16',
                 '/backbone --sizes 800x1344', '--batch 1 --modes infer',
                 '/backbone_train --sizes 800x1344',
                 '--batch 2 --modes train'),
    'graphs': ('backbone_graphs', 'xcit_small_12_p16@amp+graphs',
               'backbone_graphs_train'),
    'heads': ('mask_rcnn_swin_t@amp', 'mask_rcnn_xcit_s12@amp',
              'upernet_xcit_s12@amp', 'mask_rcnn_xcit_s12@amp+iter',
              'mask_rcnn_swin_t@amp+iter', 'upernet_xcit_s12@amp+iter',
              '-m benchmarks.gpu.iteration_probe'),
    'compiled': ('backbone_compiled', 'xcit_small_12_p16@compile',
                 '-m benchmarks.gpu.launch_probe', '--compile-only'),
    'demos': ('-m benchmarks.gpu.amp_gradients',
              'bash benchmarks/gpu/demos.sh', '/demos'),
    'table': ('-m benchmarks.gpu.table', ),
}


@pytest.mark.parametrize('step', STEPS)
def test_each_step_runs_what_it_says(step):
    proc = subprocess.run(['make', '-n', f'gpu-report-{step}',
                           'PY=python'], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    for command in STEPS[step]:
        assert command in proc.stdout, command
    # every module and script it runs is there
    for module in re.findall(r' -m ([\w.]+)', proc.stdout):
        if module.startswith('benchmarks.'):
            assert (REPO / f"{module.replace('.', '/')}.py").is_file(), \
                module
    for script in re.findall(r'(?:bash|python) (\S+\.(?:sh|py))',
                             proc.stdout):
        assert (REPO / script).is_file(), script
    # the compilations, the longest part, in their own step; so are the
    # rows replayed from CUDA graphs (the probe replays its configurations)
    assert ('@compile' in proc.stdout) == (step == 'compiled')
    assert ('+graphs' in proc.stdout) == (step == 'graphs')
    # on CUDA '@always' differs from the default in the up-sampler alone,
    # which the probe times on and off: no '@always' rows
    assert '@always' not in proc.stdout


@pytest.mark.parametrize('step', ['backbone', 'graphs'])
def test_published_backbone_in_the_same_run_where_its_file_is_given(step):
    """The targets' yardstick: with ``GPU_PUBLISHED`` the backbone's rows
    and the graphed ones are measured beside the published code's, in the
    same runs; without it, no such row."""
    def dry_run(*args):
        return subprocess.run(['make', '-n', f'gpu-report-{step}',
                               'PY=python', *args], cwd=REPO,
                              capture_output=True, text=True).stdout
    given = dry_run('GPU_PUBLISHED=pub/xcit.py')
    runs = given.split("tools/benchmark.py")[1:]
    assert len(runs) == 2
    assert all('--published-code pub/xcit.py' in c and
               'xcit_small_12_p16@published+amp' in c for c in runs)
    assert '@published' not in dry_run()


def _row(model, seconds, peak, **extra):
    return dict(dict(model=model, h=800, w=1344, batch=1, mode='infer',
                     seconds=seconds, peak_mem_gib=peak,
                     activation_mem_gib=peak, images_per_s=1 / seconds,
                     first_call_s=1.0), **extra)


def test_steps_with_a_given_python_skip_the_set_up():
    """``make gpu-report PY=python3 STEP='tests backbone'`` on a GPU
    machine whose Python is set up already (the lent machine's image):
    the steps in order with that Python, without ``make install``; without
    PY, the set-up first. The same for ``make demo``."""
    def dry_run(*args, target='gpu-report'):
        return subprocess.run(['make', '-n', target, *args], cwd=REPO,
                              capture_output=True, text=True).stdout
    out = dry_run('PY=python3', 'STEP=tests backbone')
    assert 'setup_env.sh' not in out
    assert out.index('python3 -m pytest') < out.index(
        'python3 tools/benchmark.py')
    assert 'setup_env.sh' in dry_run('STEP=tests')
    # so does `make demo` (timed on a GPU machine's Python)
    demo = dry_run('PY=python3', target='demo')
    assert 'setup_env.sh' not in demo and 'python3 tools/train.py' in demo
    assert 'setup_env.sh' in dry_run(target='demo')


def test_a_failed_step_does_not_stop_the_next(tmp_path):
    """One lent machine, one command: a step that fails (a failed test)
    still lets the measurements after it run; make names the failed steps
    and exits non-zero. (A stand-in Python that sees CUDA and fails
    whatever else it is asked.) A step that is not one stops everything
    before it runs."""
    python = tmp_path / 'python'
    python.write_text('#!/bin/sh\ncase "$2" in *cuda.is_available*) exit 0;; '
                      'esac\nexit 3\n')
    python.chmod(0o755)

    def report(steps):
        return subprocess.run(
            ['make', 'gpu-report', f'PY={python}', f'STEP={steps}',
             f'GPU_REPORT={tmp_path}'], cwd=REPO,
            capture_output=True, text=True)
    proc = report('table table')
    assert proc.returncode != 0
    assert proc.stdout.count('[gpu-report] table ->') == 2, proc.stdout
    assert '[gpu-report] failed: table table' in proc.stdout
    proc = report('table tabel')
    assert proc.returncode != 0
    assert 'STEP=tabel is not a step' in proc.stdout
    assert '[gpu-report] table ->' not in proc.stdout


def test_demos_step_takes_the_demos_named():
    """``GPU_DEMOS`` names the demos of ``STEP=demos`` (a few at a time fit
    a 10-minute command); without it, the script's five."""
    def command(*args):
        proc = subprocess.run(['make', '-n', '--no-print-directory',
                               'gpu-report-demos', 'PY=python', *args],
                              cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return ' '.join(proc.stdout.replace('\\\n', ' ').split())
    demo = 'configs/ade20k/demo_upernet_xcit_nano_synthetic.py'
    # the demos' command, before the gradient probe that follows it
    assert command(f'GPU_DEMOS={demo}').split(';')[0].strip().endswith(
        f'demos.sh work_dirs/gpu_report/demos {demo}')
    assert command().split(';')[0].strip().endswith(
        'demos.sh work_dirs/gpu_report/demos')


def test_demos_train_at_once_and_report_each(tmp_path):
    """``STEP=demos``' script with stand-ins for the launcher and Python
    (the launch itself is tests/test_cuda.py's): every demo started at
    once through ``dist_train.sh CONFIG 1 --amp`` with SyncBN on a port of
    its own, a log each (named by the dataset's folder too: COCO's and
    ADE20K's Mask2Former demos share a file name), then each one's exit
    status, time and last validation line; non-zero when one failed."""
    launcher = tmp_path / 'dist_train.sh'
    launcher.write_text(
        'echo "$1 $2 $3 $7 $8 PORT=$PORT in $5"\n'
        'echo "... - mmengine - INFO - Iter(val) [1/4]    eta: 0:00:03"\n'
        'echo "... - mmengine - INFO - Iter(val) [4/4]    mIoU: 47.0"\n'
        'case "$1" in *broken*) exit 3;; esac\n')
    out = tmp_path / 'demos'
    proc = subprocess.run(
        ['bash', 'benchmarks/gpu/demos.sh', str(out), 'a/demo_good.py',
         'b/demo_good.py', 'a/demo_broken.py'], cwd=REPO,
        capture_output=True, text=True,
        env=dict(os.environ, PYTHON='true', DIST_TRAIN=str(launcher)))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    good = (out / 'a_demo_good.log').read_text()
    broken = (out / 'a_demo_broken.log').read_text()
    assert 'a/demo_good.py 1 --amp sync_bn=torch' in good
    assert 'in work_dirs/gpu_demos/a_demo_good' in good
    assert 'in work_dirs/gpu_demos/b_demo_good' in (
        out / 'b_demo_good.log').read_text()
    assert re.search(r'PORT=(\d+)', good)[1] != \
        re.search(r'PORT=(\d+)', broken)[1]
    assert '[demos] a_demo_good: exit status 0 after' in proc.stdout
    assert '[demos] b_demo_good: exit status 0 after' in proc.stdout
    assert '[demos] a_demo_broken: exit status 3 after' in proc.stdout
    assert proc.stdout.count('Iter(val) [4/4]    mIoU: 47.0') == 3
    assert 'eta:' not in proc.stdout


def test_table_from_the_steps_rows(tmp_path):
    run = dict(
        matmul=dict(fp32_gflops_per_s=49433.0, bf16_gflops_per_s=663527.0),
        threads=16, device='cuda', argv=['--device', 'cuda', '--sizes',
                                         '800x1344'],
        machine=dict(gpu='NVIDIA H100 80GB HBM3', torch='2.11.0+cu130',
                     cuda='13.0'),
        results=[_row('xcit_small_12_p16@reference', 0.0166, 0.40,
                      achieved_gflops_per_s=13900.0),
                 _row('xcit_small_12_p16', 0.0083, 0.30),
                 dict(model='xcit_small_12_p16@compile', h=800, w=1344,
                      batch=1, mode='infer', error='InductorError: boom'),
                 _row('xcit_small_12_p16@compile', 0.0127, 0.30, batch=2,
                      compile_failure='BackendCompilerFailed: bang'),
                 _row('xcit_small_12_p16@graphs', 0.0127, 0.30, batch=2),
                 _row('xcit_small_12_p16@amp+graphs', 0.004, 0.30, batch=2,
                      graphs_captures=1, host_seconds=0.0012),
                 _row('xcit_small_12_p16@bf16', 0.015, 0.37, triton_kernels={
                     "XCA's attention, cuda:0, bfloat16": 'ran',
                     'LPI, cuda:0, bfloat16': 'OutOfResources: shared'})])
    (tmp_path / 'backbone').mkdir()
    (tmp_path / 'backbone' / 'results.json').write_text(json.dumps(run))
    proc = run_tool_here('benchmarks/gpu/table.py', tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert ('**backbone**: NVIDIA H100 80GB HBM3, PyTorch 2.11.0+cu130, '
            'CUDA 13.0; matmul fp32 49.4 TFLOP/s, bf16 663.5 TFLOP/s; '
            '`python tools/benchmark.py --device cuda --sizes 800x1344`'
            in out)
    assert ('| xcit_small_12_p16@reference | 800x1344 | 1 | infer | 16.6 |'
            '  | 0.40 |  | 13.9 |') in out
    assert ('| xcit_small_12_p16 | 800x1344 | 1 | infer | 8.3 | 2.00x | '
            '0.30 | 0.75 |  |') in out
    assert '| xcit_small_12_p16@compile | 800x1344 | 1 | infer | failed: ' \
        'InductorError: boom |' in out
    # rows that ran eagerly under a name that asks for more say so
    assert '| xcit_small_12_p16@compile (eager, compilation failed: ' \
        'BackendCompilerFailed: bang) | 800x1344 | 2 | infer | 12.7 |' in out
    assert '| xcit_small_12_p16@graphs (eager, no CUDA graph captured) | ' \
        '800x1344 | 2 | infer |' in out
    # the step's host part (until it returned to the CPU) beside its time
    assert '| xcit_small_12_p16@amp+graphs | 800x1344 | 2 | infer | 4.0 ' \
        '(host 1.2) |' in out
    # a part whose kernels failed ran its straightforward computation
    assert '| xcit_small_12_p16@bf16 (LPI, cuda:0, bfloat16: ' \
        'straightforward, OutOfResources: shared) | 800x1344 | 1 | infer |' \
        in out
    # a run beside the published backbone: its column
    run['results'] = [_row('xcit_small_12_p16@published', 0.0166, 0.29),
                      _row('xcit_small_12_p16@reference', 0.0124, 0.31),
                      _row('xcit_small_12_p16@graphs', 0.0083, 0.31,
                           graphs_captures=1)]
    (tmp_path / 'backbone_graphs').mkdir()
    (tmp_path / 'backbone_graphs' / 'results.json').write_text(
        json.dumps(run))
    out = run_tool_here('benchmarks/gpu/table.py', tmp_path).stdout
    graphed = out.split('**backbone_graphs**')[1]
    assert '| vs straightforward | vs published | peak mem (GiB) |' in graphed
    assert '| vs published |' not in out.split('**backbone_graphs**')[0]
    assert ('| xcit_small_12_p16@graphs | 800x1344 | 1 | infer | 8.3 | '
            '1.49x | 2.00x | 0.31 | 1.00 |  |') in graphed
    empty = run_tool_here('benchmarks/gpu/table.py', tmp_path / 'none')
    assert empty.returncode != 0 and 'no results.json' in empty.stderr


def test_table_file_only_where_there_is_a_table(tmp_path):
    """``STEP=table`` prints the table and writes ``table.md`` whole; a
    report without rows says so and writes nothing (it left an empty
    ``table.md``, and made the report's folder)."""
    proc = subprocess.run(['make', '-n', 'gpu-report-table', 'PY=python',
                           f'GPU_REPORT={tmp_path}'], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f'--out {tmp_path}/table.md' in proc.stdout
    assert '>' not in proc.stdout and 'mkdir' not in proc.stdout
    empty = tmp_path / 'none'
    proc = run_tool_here('benchmarks/gpu/table.py', empty, '--out',
                         empty / 'table.md')
    assert proc.returncode == 1 and 'no results.json' in proc.stderr
    assert not empty.exists()
    run = dict(matmul=dict(fp32_gflops_per_s=1e3, bf16_gflops_per_s=2e3),
               device='cuda', argv=[],
               results=[_row('xcit_small_12_p16', 0.0083, 0.30)])
    (tmp_path / 'backbone').mkdir()
    (tmp_path / 'backbone' / 'results.json').write_text(json.dumps(run))
    proc = run_tool_here('benchmarks/gpu/table.py', tmp_path, '--out',
                         tmp_path / 'table.md')
    assert proc.returncode == 0, proc.stderr
    assert '| xcit_small_12_p16 | 800x1344 | 1 | infer | 8.3 |' in \
        proc.stdout
    assert (tmp_path / 'table.md').read_text() == proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ['backbone',
                                                           'table.md']


def test_tile_sweep_runs_every_candidate_and_tabulates(tmp_path):
    """``STEP=tiles``, interpreted at a tiny size with more tokens than one
    tile, one image (the times mean nothing here): a row per candidate,
    the default first, each candidate's results those of the default's
    tiles, the module constants put back after, and the fastest in the GPU
    table."""
    from xcit_dense.models.ops import lpi_kernels, xca_kernels
    before = (dict(xca_kernels.TILES), xca_kernels.BLOCK_N,
              lpi_kernels.TILE_WARPS, lpi_kernels.BLOCK_N)
    proc = run_tool_here('benchmarks/gpu/tile_sweep.py', '--out',
                         tmp_path, '--dtypes', 'float32', '--size', '5x9',
                         '--channels', '32', '--heads', '2', '--batch', '1',
                         '--warmup', '0', '--repeat', '1', '--limit', '2')
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in
            (tmp_path / 'tile_sweep.jsonl').read_text().splitlines()]
    assert [(r['part'], r['default']) for r in rows] == [
        ('xca', True), ('xca', False), ('lpi', True), ('lpi', False)]
    assert rows[1]['constants']['TILES']['ieee'] == [32, 4]
    assert rows[3]['constants'] == dict(TILE_WARPS=4, BLOCK_N=32, BLOCK_C=64)
    assert all(r['ms'] > 0 and r['max_rel_diff_vs_default'] < 1e-5
               for r in rows), rows
    assert (dict(xca_kernels.TILES), xca_kernels.BLOCK_N,
            lpi_kernels.TILE_WARPS, lpi_kernels.BLOCK_N) == before
    out = run_tool_here('benchmarks/gpu/table.py', tmp_path).stdout
    assert '| part | dtype | default (ms) | fastest (ms) |' in out
    assert out.count('| float32 |') == 2


def test_compile_probe_rows_on_the_cpu(tmp_path):
    """``benchmarks/gpu/compile_probe.py`` (where the backbone compiled
    with dynamic H and W differs from eager, by part) writes a row per part
    and size; with dynamo's ``eager`` backend nothing is compiled, so each
    part is eager's to rounding (the comparison itself checked), and what
    it switches for the run is put back."""
    from xcit_dense.models.ops import second_moments
    pays = second_moments.pays
    proc = run_tool_here('benchmarks/gpu/compile_probe.py', '--out',
                         tmp_path, '--device', 'cpu', '--backend', 'eager',
                         '--parts', 'taps', 'resamplers',
                         '--sizes', '32x48', '48x32')
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in
            (tmp_path / 'compile_probe.jsonl').read_text().splitlines()]
    assert [(r['part'], r['size']) for r in rows] == [
        (part, size) for part in (
            'taps', 'resampler0', 'resampler0, straightforward',
            'resampler1', 'resampler1, straightforward', 'resampler2',
            'resampler3')
        for size in ('32x48', '48x32')]
    for row in rows:
        assert 'error' not in row, row
        assert max(row['outputs']) < 1e-6 and row['worst_gradient'] < 1e-4
    assert len(rows[0]['outputs']) == 4  # the four taps
    assert second_moments.pays is pays


def test_amp_gradients_rows_on_the_cpu(tiny_coco, tmp_path):
    """``benchmarks/gpu/amp_gradients.py`` (a training step's gradients
    under autocast against fp32's, by part) on a small COCO Mask2Former
    demo under bf16 autocast: fp32 again is fp32's gradients exactly,
    autocast's differ by its rounding and are finite, and running the pixel
    decoder, or its deformable attention alone, in fp32 changes what
    autocast computes."""
    proc = run_tool_here(
        'benchmarks/gpu/amp_gradients.py', '--out', tmp_path,
        '--device', 'cpu', '--dtype', 'bfloat16', '--batches', '1',
        '--cfg-options', 'model.backbone.depth=4',
        'model.backbone.out_indices=(0,1,2,3)',
        'model.panoptic_head.num_queries=10',
        'model.panoptic_head.transformer_decoder.num_layers=3',
        'model.panoptic_head.pixel_decoder.encoder.num_layers=1',
        # mmdet's pixel decoder, which autocast runs in bf16 (the recipes'
        # runs in fp32: tests/test_pixel_decoder.py)
        'model.panoptic_head.pixel_decoder.type=mmdet.'
        'MSDeformAttnPixelDecoder',
        'train_dataloader.batch_size=1', 'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False',
        f'train_dataloader.dataset.data_root={tiny_coco}/')
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {row['variant']: row for row in map(json.loads, (
        tmp_path / 'amp_gradients.jsonl').read_text().splitlines())}
    fp32_decoder = 'autocast, fp32 panoptic_head.pixel_decoder'
    fp32_attention = 'autocast, fp32 MultiScaleDeformableAttention'
    assert list(rows) == ['rerun', 'autocast', fp32_decoder, fp32_attention]
    rerun = rows['rerun']
    assert {'backbone.blocks', 'panoptic_head.pixel_decoder',
            'panoptic_head.transformer_decoder', 'all'} <= set(rerun['parts'])
    assert all(part['relative'] == 0.0 and part['finite']
               for part in rerun['parts'].values())
    # the matcher's assignments recorded: a rerun assigns all as fp32
    assert rerun['loss'] == rerun['fp32_loss']
    assert rerun['assigned_as_fp32'] == 1.0
    for variant in ('autocast', fp32_decoder, fp32_attention):
        row = rows[variant]
        assert 0 < row['parts']['all']['relative'] < 0.2
        assert all(part['finite'] for part in row['parts'].values())
        assert row['loss'] == pytest.approx(row['fp32_loss'], rel=0.05)
        assert 0 <= row['assigned_as_fp32'] <= 1
    decoder = 'panoptic_head.pixel_decoder'
    assert (rows[fp32_decoder]['parts'][decoder]
            != rows['autocast']['parts'][decoder]
            != rows[fp32_attention]['parts'][decoder])
