"""tools/benchmark.py runs its measurements in fresh processes (here, but
for one row, with --in-process: the same measurement in the tool's process,
without a process's 4 s of imports per row) and writes the tables, the plot
and the raw results, and with --record the rows into the results files with
the fingerprints of the code they measured (speed targets live there, not
here)."""
import json
import re

import pytest

from shrink import NARROW_MASK_RCNN_OPTIONS
from tool_runs import run_tool_here


def _run(tmp_path, *args):
    proc = run_tool_here('tools/benchmark.py', *args, '--repeat', '1',
                         '--warmup', '1', '--threads', '1', '--matmul-size',
                         '256', '--in-process', '--out-dir', tmp_path,
                         '--record', tmp_path / 'recorded')
    assert proc.returncode == 0, proc.stderr[-3000:]
    return (json.loads((tmp_path / 'results.json').read_text()),
            (tmp_path / 'results.md').read_text())


def _recorded(tmp_path, results):
    """The runs ``--record`` appended to the machine's results file (a new
    one), checked as the docs' tables check them."""
    from benchmarks import results as res
    docs = res.load(tmp_path / 'recorded')
    assert list(docs) == [res.results_file(results['machine'])]
    assert res.problems(docs) == []
    return next(iter(docs.values()))['runs']


def _rows(run):
    return {row['name']: row for row in run['rows']}


@pytest.fixture
def shallow_nano(monkeypatch):
    """XCiT-N12/16 four blocks deep (a tap each) in this process: what the
    tests check of the tool's rows (routes and their counts, precisions'
    differences, exports, ratios) does not depend on the depth, their time
    does (an ONNX export: half a second per block)."""
    from xcit_dense.models import ARCH_SETTINGS
    monkeypatch.setitem(ARCH_SETTINGS, 'nano_12_p16',
                        dict(ARCH_SETTINGS['nano_12_p16'], depth=4))


@pytest.fixture
def small_recipes(monkeypatch):
    """The detector's and segmentor's recipes in this process with their
    XCiT-S12 four blocks deep and their necks and heads 32 wide: what the
    training rows check of the tool (an iteration with the recipe's
    optimizer wrapper, the rows and runs recorded) does not depend on
    their sizes, three quarters of their steps' time does."""
    from benchmarks.harness import builders
    recipe = builders.recipe_config
    shallow = {'model.backbone.depth': 4,
               'model.backbone.out_indices': (0, 1, 2, 3)}
    narrow = {
        'mask_rcnn_xcit_s12': {k: int(v) for k, v in (
            o.split('=') for o in NARROW_MASK_RCNN_OPTIONS)},
        'upernet_xcit_s12': {'model.decode_head.channels': 32,
                             'model.auxiliary_head.channels': 32}}

    def small(base):
        cfg = recipe(base)
        cfg.merge_from_dict({**shallow, **narrow[base]})
        return cfg
    monkeypatch.setattr(builders, 'recipe_config', small)


def test_backbone_variants_and_ratios(tmp_path, shallow_nano):
    results, table = _run(
        tmp_path, '--models', 'xcit_nano_12_p16@reference',
        'xcit_nano_12_p16', 'xcit_nano_12_p16@onnxruntime',
        'xcit_nano_12_p16@openvino',
        '--sizes', '64x96', '--batch', '1', '--modes', 'infer')
    assert results['matmul']['fp32_gflops_per_s'] > 0
    assert results['matmul']['bf16_gflops_per_s'] > 0
    # the CPU named with its figures, in both outputs
    from benchmarks.harness.machine import cpu_description
    cpu = cpu_description()
    assert results['machine']['cpu'] == cpu['cpu'] != ''
    assert results['machine']['cpu_features'] == cpu['cpu_features']
    assert table.startswith(f'1 threads, device cpu ({cpu["cpu"]} (')
    rows = {r['model']: r for r in results['results']}
    assert len(rows) == 4 and not any('error' in r for r in rows.values())
    ref = rows['xcit_nano_12_p16@reference']
    assert ref['seconds'] > 0 and ref['peak_mem_gib'] > 0
    assert ref['gmac_per_image'] > 0 and ref['first_call_s'] > 0
    assert 'max_rel_diff_vs_reference' not in ref
    assert 'executed_gmac_per_image' not in ref
    assert rows['xcit_nano_12_p16']['executed_gmac_per_image'] > 0
    # fp32 is exact, measured against the reference
    assert rows['xcit_nano_12_p16']['max_rel_diff_vs_reference'] < 1e-4
    assert '| xcit_nano_12_p16 | 64x96 | 1 | infer |' in table
    ratios = table.split('Against the straightforward computation')[1]
    assert '| xcit_nano_12_p16 | 64x96 | 1 | infer |' in ratios
    assert (tmp_path / 'results.png').stat().st_size > 0
    # the runtimes: one verified export for both, fp32 parity, a ratio row
    onnx, openvino = (rows[f'xcit_nano_12_p16@{r}']
                      for r in ('onnxruntime', 'openvino'))
    assert onnx['export_s'] == openvino['export_s'] > 0
    assert list((tmp_path / 'onnx').iterdir()) == [
        tmp_path / 'onnx' / 'xcit_nano_12_p16_64x96.onnx']
    for row in (onnx, openvino):
        assert row['seconds'] > 0 and row['peak_mem_gib'] > 0
        assert row['max_rel_diff_vs_reference'] < 1e-4
    runtimes = table.split('Runtimes against our eager PyTorch path')[1]
    assert '| xcit_nano_12_p16@openvino | 64x96 | 1 |' in runtimes
    # each row with the fingerprint of the code it measured; recorded as
    # one run of the backbone's scope, ratios naming their baselines
    from benchmarks.fingerprint import code_fingerprint
    backbone = dict(scope='backbone',
                    fingerprint=code_fingerprint('backbone'))
    assert all(r['code'] == backbone for r in rows.values())
    run, = _recorded(tmp_path, results)
    assert run['code'] == backbone and run['threads'] == 1
    assert 'tools/benchmark.py --models xcit_nano_12_p16@reference' in \
        run['command'] and run['libraries']['torch']
    assert "every row in the tool's process (--in-process" in run['method']
    recorded = _rows(run)
    assert [(r['variant'], r['precision']) for r in recorded.values()] == [
        ('straightforward', 'fp32'), ('default', 'fp32'),
        ('onnxruntime', 'fp32'), ('openvino', 'fp32')]
    default = recorded['xcit_nano_12_p16']
    assert default['seconds'] == pytest.approx(
        rows['xcit_nano_12_p16']['seconds'], rel=1e-5)
    assert [x['baseline'] for x in default['ratios']] == [
        'xcit_nano_12_p16@reference/64x96/b1/infer']
    assert [x['baseline'] for x in recorded[
        'xcit_nano_12_p16@openvino']['ratios']] == [
        'xcit_nano_12_p16@reference/64x96/b1/infer', default['id']]


def test_cpu_description_reads_linux_cpuinfo(monkeypatch, tmp_path):
    """The CPU's model name and the instruction sets that decide its
    kernels, from /proc/cpuinfo's first processor; named in the table."""
    import builtins

    from benchmarks.harness import machine, report
    cpuinfo = tmp_path / 'cpuinfo'
    cpuinfo.write_text(
        'processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n'
        'flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n\n'
        'processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n')
    real_open = builtins.open
    monkeypatch.setattr(builtins, 'open', lambda path, *a, **k: real_open(
        cpuinfo if path == '/proc/cpuinfo' else path, *a, **k))
    found = machine.cpu_description()
    assert found == dict(cpu='Intel(R) Xeon(R) Processor',
                         cpu_features=['avx2', 'avx512f', 'avx512_bf16',
                                       'amx_bf16'])
    assert report._where(dict(found, torch='2.12.1')) == (
        ' (Intel(R) Xeon(R) Processor (avx2, avx512f, avx512_bf16, '
        'amx_bf16); PyTorch 2.12.1)')
    assert report._where(dict(found, gpu='NVIDIA H200')).startswith(
        ' (NVIDIA H200; host Intel(R) Xeon(R) Processor (')


def test_bf16_row_measured_against_the_fp32_reference(tmp_path, shallow_nano):
    """``@bf16`` (the backbone under its bf16 autocast): its outputs'
    difference to the fp32 straightforward computation on the same weights
    is bf16's rounding, not zero and not more (one measurement, in this
    process)."""
    import argparse

    from benchmarks.harness import measure
    row = measure.measure_here(argparse.Namespace(
        model='xcit_nano_12_p16@bf16', size=(64, 96), batch=1, mode='infer',
        device='cpu', threads=1, repeat=1, warmup=1, out_dir=str(tmp_path),
        published_code=None))
    assert 1e-4 < row['max_rel_diff_vs_reference'] < 0.05
    assert row['executed_gmac_per_image'] > 0


def test_executed_multiply_adds_are_the_rows_own(shallow_nano):
    """Each XCiT row counts what its own variant executes. XCiT-N12/16 at
    64x96 has 24 tokens per image (0.19 C): the default policy leaves XCA's
    second moments out and executes what the straightforward computation
    does, ``@always`` takes them (their C x C products, twice the
    multiply-adds); at 256x192 (1.5 C) fp32 takes them and half precision
    (``@bf16``, ``@amp``), whose threshold is higher, does not."""
    import torch

    from benchmarks.harness.counts import executed_gmac

    def executed(size, *variants):
        return executed_gmac('xcit_nano_12_p16', torch.randn(1, 3, *size),
                              set(variants))

    small = executed((64, 96), 'reference')
    assert executed((64, 96)) == small
    assert executed((64, 96), 'always') > 1.5 * small
    large = executed((256, 192), 'reference')
    assert executed((256, 192)) == executed((256, 192), 'always') < large
    assert executed((256, 192), 'bf16') == large
    assert executed((256, 192), 'amp') == large


def test_training_steps_of_backbone_detector_and_segmentor(tmp_path,
                                                          small_recipes):
    # AMP on the backbone: on a CPU without native bf16 (no AVX512-BF16 /
    # AMX) UperNet's wide 3x3 convolutions in bf16 take PyTorch's slow
    # im2col path, 20 s a step at 64x64
    # 32x32: the detector's step takes a third of its time at 64x64 (fewer
    # anchors, so fewer RoIs for the box and mask heads)
    # the detector's a whole iteration (mmengine's train_step with the
    # recipe's optimizer wrapper, fp32 on the CPU), measured in training
    # only
    results, table = _run(tmp_path, '--models', 'xcit_nano_12_p16@cp+amp',
                          'mask_rcnn_xcit_s12@reference+iter',
                          'upernet_xcit_s12@always',
                          '--sizes', '32x32', '--batch', '2', '--modes',
                          'train')
    backbone, detector, segmentor = results['results']
    assert not any('error' in r for r in results['results']), results
    assert backbone['activation_mem_gib'] > 0 and detector['seconds'] > 0
    assert segmentor['seconds'] > 0
    # a training step's multiply-adds, forward and backward, and the rate
    for row in (backbone, detector, segmentor):
        assert row['gmac_per_image'] > 0
        assert row['achieved_gflops_per_s'] == pytest.approx(
            2 * row['gmac_per_image'] * 2 / row['seconds'])
    # the recipe's optimizer wrapper, its parameter groups merged
    assert (detector['optim_wrapper'], detector['param_groups']) == \
        ('OptimWrapper', 2)
    assert 'param_groups' not in segmentor
    assert 'whole training step' in table
    assert '| mask_rcnn_xcit_s12@reference+iter | 32x32 | 2 | train |' \
        in table
    assert '| upernet_xcit_s12@always | 32x32 | 2 | train |' in table
    assert '| xcit_nano_12_p16@cp+amp | 32x32 | 2 | train |' in table
    # recorded as a run per scope: the backbone's, the whole model's
    runs = _recorded(tmp_path, results)
    assert [(r['code']['scope'], list(_rows(r))) for r in runs] == [
        ('backbone', ['xcit_nano_12_p16@cp+amp']),
        ('whole-model', ['mask_rcnn_xcit_s12@reference+iter',
                         'upernet_xcit_s12@always'])]
    assert [(r['variant'], r['precision'], r['mode'])
            for run in runs for r in run['rows']] == [
        ('default+with_cp', 'bf16 autocast', 'train'),
        ('straightforward', 'fp32', 'iter'),
        ('default+always', 'fp32', 'train')]
    # the backbone's row in a fresh process, as the tool measures by
    # default: the same measurement, its memory that process's own
    import argparse

    from benchmarks.harness.runs import _run_worker
    fresh = _run_worker('xcit_nano_12_p16@cp+amp', (32, 32), 2, 'train',
                        argparse.Namespace(device='cpu', threads=1, repeat=1,
                                           warmup=1, out_dir=str(tmp_path),
                                           timeout=600))
    assert 'error' not in fresh, fresh
    assert set(backbone) - set(fresh) == {'code', 'round', 'rounds',
                                          'round_seconds'}
    assert fresh['gmac_per_image'] == backbone['gmac_per_image']
    assert fresh['activation_mem_gib'] > 0 and fresh['seconds'] > 0
    assert (fresh['memory'], backbone['memory']) == (
        'peak RSS of the process', 'peak RSS of the process during the steps')
    assert 'every measurement in it (--in-process)' in table


def test_each_variant_against_the_reference_of_its_precision():
    """@amp against @reference+amp, @bf16 against @reference+bf16, the
    fp32 rows against @reference, whichever order the rows came in; a
    precision without its own reference falls back to fp32's; an @iter row
    against an iteration's reference."""
    from benchmarks.harness.report import ratio_rows

    def row(model, seconds, mem):
        return dict(model=model, h=64, w=96, batch=1, mode='infer',
                    seconds=seconds, peak_mem_gib=mem,
                    activation_mem_gib=mem / 2)

    results = [row('xcit_nano_12_p16@reference', 10.0, 1.0),
               row('xcit_nano_12_p16', 5.0, 1.0),
               row('xcit_nano_12_p16@reference+amp', 8.0, 0.8),
               row('xcit_nano_12_p16@amp', 2.0, 0.4),
               row('xcit_nano_12_p16@reference+bf16', 20.0, 2.0),
               row('xcit_nano_12_p16@bf16', 4.0, 1.0),
               row('xcit_nano_12_p16@always', 2.5, 0.5)]
    speedups = {r['model']: (r['speedup'], r['peak_mem_ratio'])
                for r in ratio_rows(results)}
    assert speedups == {'xcit_nano_12_p16': (2.0, 1.0),
                        'xcit_nano_12_p16@amp': (4.0, 0.5),
                        'xcit_nano_12_p16@bf16': (5.0, 0.5),
                        'xcit_nano_12_p16@always': (4.0, 0.5)}
    fp32_only = [results[0], results[3]]
    assert ratio_rows(fp32_only)[0]['speedup'] == 5.0
    # a whole iteration against an iteration (of its precision, else fp32)
    iterations = [row('mask_rcnn_xcit_s12@reference+amp', 1.0, 1.0),
                  row('mask_rcnn_xcit_s12@reference+iter', 3.0, 1.0),
                  row('mask_rcnn_xcit_s12@amp+iter', 1.5, 1.0),
                  row('mask_rcnn_xcit_s12@amp', 0.5, 1.0)]
    assert {r['model']: r['speedup'] for r in ratio_rows(iterations)} == {
        'mask_rcnn_xcit_s12@amp+iter': 2.0, 'mask_rcnn_xcit_s12@amp': 2.0}


def _results_table(tmp_path, runs, rounds=1):
    """``results.md`` of ``runs`` (each measurement's rounds)."""
    import argparse

    from benchmarks.harness.report import write_table
    from benchmarks.harness.runs import combine
    args = argparse.Namespace(threads=1, device='cpu', repeat=1, warmup=1,
                              rounds=rounds, matmul_size=256)
    path = tmp_path / 'results.md'
    write_table([combine(r) for r in runs], dict(fp32_gflops_per_s=1.0,
                                                 bf16_gflops_per_s=2.0),
                args, path)
    return path.read_text()


def _measured(model, rnd, seconds, size=(64, 96), **counts):
    """A row as a measurement writes it (an error for ``seconds=None``)."""
    if seconds is None:
        return dict(model=model, h=size[0], w=size[1], batch=1,
                    mode='infer', round=rnd, error='out of memory')
    return dict(dict(model=model, h=size[0], w=size[1], batch=1,
                     mode='infer', round=rnd, seconds=seconds,
                     images_per_s=1 / seconds, first_call_s=0.0342,
                     peak_mem_gib=0.75, activation_mem_gib=0.0234,
                     gmac_per_image=0.076), **counts)


def test_results_table_lists_each_rounds_speedup(tmp_path):
    """``results.md``: each round's speed-up (round i of the reference over
    round i) beside the ratio of the rows' median rounds, a failed round
    left out (docs/performance.md says they are listed; they were not)."""
    def rounds(model, times):
        return [_measured(model, i, t) for i, t in enumerate(times)]

    table = _results_table(tmp_path, [
        rounds('xcit_nano_12_p16@reference', (3.0, 2.0, 4.0)),
        rounds('xcit_nano_12_p16', (1.0, 2.0, 2.0)),
        rounds('xcit_nano_12_p16@always', (1.5, None, 3.0))], rounds=3)
    assert '| xcit_nano_12_p16 | 64x96 | 1 | infer | 1.50x (rounds: 3.00, ' \
        '1.00, 2.00) |' in table
    assert '| xcit_nano_12_p16@always | 64x96 | 1 | infer | 2.00x ' \
        '(rounds: 2.00, 1.33) |' in table
    # one round: the ratio alone
    table = _results_table(tmp_path, [
        rounds('xcit_nano_12_p16@reference', (3.0, )),
        rounds('xcit_nano_12_p16', (1.0, ))])
    assert '| xcit_nano_12_p16 | 64x96 | 1 | infer | 3.00x | 1.00 |' in table


def test_results_table_keeps_small_values_significant(tmp_path):
    """A tiny model's small values with three significant digits (its
    multiply-adds and first call were printed as 0.1 and 0.0), larger
    ones as before."""
    table = _results_table(tmp_path, [
        [_measured('xcit_nano_12_p16', 0, 2.0,
                   executed_gmac_per_image=0.0753,
                   achieved_gflops_per_s=0.0753 * 2 / 2.0)],
        [_measured('xcit_small_12_p16', 0, 1.316, (800, 1344),
                   first_call_s=1.5, peak_mem_gib=1.24,
                   activation_mem_gib=0.42, gmac_per_image=115.5,
                   executed_gmac_per_image=98.7,
                   achieved_gflops_per_s=150.0)]])
    assert '| xcit_nano_12_p16 | 64x96 | 1 | infer | 2.000 | 0.50 | ' \
        '0.0342 | 0.75 | 0.0234 | 0.0760 | 0.0753 | 0.0753 |' in table
    assert '| xcit_small_12_p16 | 800x1344 | 1 | infer | 1.316 | 0.76 | ' \
        '1.5 | 1.24 | 0.42 | 115.5 | 98.7 | 150 |' in table


def test_graph_pools_idle_memory_counts_toward_the_peak():
    """A CUDA graph's activations are allocated at its capture and then
    held by its private pool unallocated: the peak of a replayed step
    counts them (segments of ``torch.cuda.memory._snapshot()``'s layout;
    pool (0, 0) is the caching allocator's own, whose free memory any
    tensor can take)."""
    from benchmarks.harness.measure import idle_graph_pool_bytes

    def segment(pool, total, allocated):
        return dict(segment_pool_id=pool, total_size=total,
                    allocated_size=allocated, segment_type='large')

    snapshot = dict(segments=[segment((0, 0), 100, 10),
                              segment((1, 0), 60, 20),
                              segment([2, 0], 30, 30),
                              segment((2, 0), 8, 0)])
    assert idle_graph_pool_bytes(snapshot) == 48
    assert idle_graph_pool_bytes(dict(segments=[])) == 0


@pytest.mark.parametrize('option,value', [('--batch', '0'),
                                          ('--repeat', '0'),
                                          ('--rounds', '0'),
                                          ('--warmup', '0')])
def test_benchmark_rejects_counts_below_one(option, value, tmp_path):
    proc = run_tool_here('tools/benchmark.py', '--models', 'xcit_nano_12_p16',
                         option, value, '--out-dir', tmp_path)
    assert proc.returncode == 2 and 'Traceback' not in proc.stderr
    assert re.search(f'error: {option} must be at least 1',
                     proc.stderr.strip().splitlines()[-1]), proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize('option,value,message', [
    ('--sizes', '0x0', 'size must be HxW with H, W >= 1'),
    ('--timeout', '0', '0 is not a number of seconds > 0'),
    ('--matmul-size', '0', "expected a positive integer, got '0'"),
    ('--threads', '0', "expected a positive integer, got '0'")])
def test_benchmark_rejects_sizes_and_limits_below_one(option, value, message,
                                                      tmp_path):
    """Refused by argparse before the reference matmul runs (a 0x0 size
    ran it, then recorded an error row and exited 0)."""
    proc = run_tool_here('tools/benchmark.py', '--models', 'xcit_nano_12_p16',
                         option, value, '--out-dir', tmp_path)
    assert proc.returncode == 2 and 'Traceback' not in proc.stderr
    assert message in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize('model,modes,why', [
    ('xcit_nano_12_p16@onnxruntime', 'train',
     'a runtime (onnxruntime, openvino) runs the exported graph, in '
     'inference only; give --modes infer'),
    ('mask_rcnn_xcit_s12@iter', 'infer',
     "'iter' is a whole training iteration, measured in training only; "
     'give --modes train'),
    ('upernet_xcit_s12@compile', 'train',
     "a segmentor's 'compile' is its exported graph's, measured in "
     'inference only')])
def test_benchmark_refuses_a_model_no_mode_measures(model, modes, why,
                                                    tmp_path):
    """A model measured in none of the given modes is refused before any
    measurement (the run wrote nothing and said it had written the
    results)."""
    out = tmp_path / 'out'
    proc = run_tool_here('tools/benchmark.py', '--models', model, '--modes',
                         modes, '--threads', '1', '--matmul-size', '256',
                         '--out-dir', out)
    assert proc.returncode == 2 and 'Traceback' not in proc.stderr
    assert f'error: {model} measures nothing with --modes {modes}: {why}' \
        in proc.stderr, proc.stderr
    assert 'wrote' not in proc.stdout and not out.exists()


def test_benchmark_out_dir_that_is_a_file(tmp_path):
    a_file = tmp_path / 'results'
    a_file.write_text('')
    proc = run_tool_here('tools/benchmark.py', '--models', 'xcit_nano_12_p16',
                         '--out-dir', a_file)
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr
    assert 'is a file; --out-dir names the folder to write.' in proc.stderr


def test_benchmark_rejects_bad_names(tmp_path, small_recipes):
    import runpy

    from conftest import REPO
    tool = runpy.run_path(str(REPO / 'tools/benchmark.py'))
    for name, message in [
            ('alexnet', "unknown model 'alexnet'"),
            ('xcit_huge_p16', 'unknown XCiT preset'),
            ('xcit_nano_12_p16@fast', 'unknown variant'),
            ('swin_t@bf16', "unknown model 'swin_t@bf16'"),
            ('xcit_nano_12_p16@onnxruntime+bf16', 'takes no other variant'),
            ('upernet_xcit_s12@cp', 'unknown variant'),
            ('mask_rcnn_swin_t@reference', 'unknown variant'),
            ('xcit_nano_12_p16@reference+always', 'exclude each other'),
            ('mask_rcnn_xcit_s12@reference+always', 'exclude each other'),
            ('upernet_xcit_s12@openvino+iter', 'a whole training iteration'),
            ('xcit_nano_12_p16@iter', 'unknown variant')]:
        with pytest.raises(ValueError, match=re.escape(message)):
            tool['parse_model'](name)
    # an iteration is measured in training only
    from benchmarks.harness import inferable, trainable
    assert trainable('mask_rcnn_swin_t@amp+iter')
    assert not inferable('mask_rcnn_swin_t@amp+iter')
    from benchmarks.harness.builders import recipe_backbone
    for name, fast, graphs in [('always', 'always', 'auto'),
                               ('amp', True, 'auto'),
                               ('amp+eager', True, False),
                               ('reference+amp', False, False)]:
        backbone = dict(type='xcit_dense.XCiT', fast_path=True,
                        compile_cfg='auto', cuda_graphs='auto')
        recipe_backbone(backbone, tool['parse_model'](
            f'mask_rcnn_xcit_s12@{name}')[1])
        assert (backbone['fast_path'], backbone['cuda_graphs']) == \
            (fast, graphs), name
    from benchmarks.harness.builders import build_detector
    detector = build_detector(
        *tool['parse_model']('mask_rcnn_xcit_s12@always'))
    assert detector.backbone.fast_path == 'always'
    assert detector.backbone.cuda_graphs == 'auto'  # the recipe's
    proc = run_tool_here('tools/benchmark.py', '--models', 'alexnet',
                         '--out-dir', tmp_path)
    assert proc.returncode == 2 and "unknown model 'alexnet'" in proc.stderr
    proc = run_tool_here('tools/benchmark.py', '--models',
                         'mask_rcnn_xcit_s12@amp', '--out-dir', tmp_path)
    assert proc.returncode == 2 and 'needs a GPU' in proc.stderr


def test_benchmark_options_say_their_defaults():
    """Every option says what it is and its default."""
    import runpy

    from conftest import REPO
    tool = runpy.run_path(str(REPO / 'tools/benchmark.py'))
    helps = {a.dest: a.help for a in tool['build_parser']()._actions}
    for option in ('models', 'sizes', 'batch', 'modes', 'device', 'threads',
                   'repeat', 'warmup', 'rounds', 'timeout', 'matmul_size',
                   'out_dir'):
        assert 'default: ' in (helps[option] or ''), option
    assert 'default: 512x512 800x1344 1024x1024 1600x2688)' in \
        helps['sizes']


def test_benchmark_lists_every_model_and_refuses_empty_variants(tmp_path):
    """The help and an unknown name list every model with its variants
    (the detectors' too); an empty variant is refused as an unknown one is
    (it named a row 'xcit_nano_12_p16@')."""
    import runpy

    from conftest import REPO
    tool = runpy.run_path(str(REPO / 'tools/benchmark.py'))
    detectors = 'mask_rcnn_xcit_s12[@variant+...] (variants: reference, ' \
        'always, eager, amp, bf16, iter, onnxruntime, openvino, int8), ' \
        'mask_rcnn_swin_t[@amp+iter], upernet_xcit_s12[@variant+...]'
    proc = run_tool_here('tools/benchmark.py', '--help')
    assert proc.returncode == 0
    assert detectors in ' '.join(proc.stdout.split())
    with pytest.raises(ValueError, match=re.escape(detectors)):
        tool['parse_model']('alexnet')
    for name in ('xcit_nano_12_p16@', 'xcit_nano_12_p16@reference+',
                 'xcit_nano_12_p16@cp++amp', 'mask_rcnn_xcit_s12@'):
        with pytest.raises(ValueError, match=re.escape(
                f'empty variant in {name!r}')):
            tool['parse_model'](name)
    proc = run_tool_here('tools/benchmark.py', '--models',
                         'xcit_nano_12_p16@', '--out-dir', tmp_path / 'out')
    assert proc.returncode == 2 and 'Traceback' not in proc.stderr
    assert "error: empty variant in 'xcit_nano_12_p16@'" in proc.stderr
    assert not (tmp_path / 'out').exists()


def test_a_timeout_is_shown_as_given(tmp_path):
    """--timeout 0.05: the row says 0.05 s (it said 0 s)."""
    import argparse

    from benchmarks.harness.runs import _run_worker
    args = argparse.Namespace(device='cpu', threads=1, repeat=1, warmup=1,
                              out_dir=str(tmp_path), timeout=0.05)
    row = _run_worker('xcit_nano_12_p16', (32, 32), 1, 'infer', args)
    assert row['error'] == 'timeout (0.05 s)'


def test_a_failed_measurement_says_why():
    """A crash in a kernel or the driver is not reported as memory."""
    from benchmarks.harness.runs import failure_reason
    assert failure_reason(-11, '') == 'killed by SIGSEGV'
    assert failure_reason(-6, 'Fatal Python error') == 'killed by SIGABRT'
    assert failure_reason(-9, '') == 'killed by SIGKILL (out of memory?)'
    assert failure_reason(1, 'torch.OutOfMemoryError: CUDA out of memory. '
                          'Tried to allocate 2 GiB') == 'out of memory'
    assert failure_reason(1, 'Traceback\n  ...\nValueError: bad size\n') == \
        'ValueError: bad size'
    assert failure_reason(1, '') == 'failed'


@pytest.mark.parametrize('groups', [1, 16])
def test_training_multiply_adds_of_grouped_convolutions(groups):
    """A training step's count: each of a convolution's two gradients as
    many multiply-adds as its forward, grouped (LPI's depth-wise ones)
    too, where torch.utils.flop_counter's own formula counts the weight's
    gradient times the groups."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from benchmarks.harness.counts import conv_backward_flops
    conv = torch.nn.Conv2d(16, 16, 3, padding=1, groups=groups)
    x = torch.randn(2, 16, 6, 8, requires_grad=True)
    with FlopCounterMode(display=False) as forward:
        conv(x)
    with FlopCounterMode(display=False, custom_mapping={
            torch.ops.aten.convolution_backward: conv_backward_flops
    }) as step:
        conv(x).sum().backward()
    assert step.get_total_flops() == 3 * forward.get_total_flops()


def _published_row(tmp_path, code):
    """``@published``'s inference row of the file at ``code`` (XCiT-N12,
    32 x 64)."""
    import argparse

    from benchmarks.harness import measure
    args = argparse.Namespace(
        model='xcit_nano_12_p16@published', size=(32, 64), batch=1,
        mode='infer', device='cpu', threads=1, repeat=1, warmup=1,
        out_dir=str(tmp_path), published_code=str(code))
    return measure.measure_here(args)


def test_published_backbone_row(tmp_path):
    """``@published``: the published backbone's file as it is written (a
    stand-in written from its formulas, tests/fixtures/published_xcit.py),
    its old imports answered by stand-ins (no module of the process
    replaced), built as the published configs build it; its inference row
    reports its difference to our straightforward computation on its
    weights (fp32 rounding; a file that computes otherwise, its positional
    encoding's rows and columns swapped, differs); counted as the published
    design, not as our fast path; bad files and a missing file name say
    what to give."""
    import sys

    import mmdet.utils

    from benchmarks.harness import published
    from xcit_dense import UserError

    from conftest import REPO
    code = tmp_path / 'xcit.py'
    source = (REPO / 'tests/fixtures/published_xcit.py').read_text()
    code.write_text(source)
    row = _published_row(tmp_path, code)
    assert row['max_rel_diff_vs_reference'] < 1e-5
    assert row['gmac_per_image'] > 0 and row['seconds'] > 0
    assert 'executed_gmac_per_image' not in row
    assert 'mmcv.runner' not in sys.modules
    assert not hasattr(mmdet.utils, 'get_root_logger')
    model = published.build_published(str(code), 'tiny_24_p8')
    assert (model.patch_embed.patch_size, len(model.blocks),
            model.out_indices) == ((8, 8), 24, [7, 11, 15, 23])
    assert 'pos_embeder.token_projection.weight' in model.state_dict()
    published_order = 'torch.cat((row_code, col_code)'
    assert published_order in source
    code.write_text(source.replace(published_order,
                                   'torch.cat((col_code, row_code)'))
    assert _published_row(tmp_path, code)['max_rel_diff_vs_reference'] > 0.01
    with pytest.raises(UserError, match='no such file'):
        published.load_published_code(str(tmp_path / 'none.py'))
    code.write_text("raise ImportError('No module named timm.models.xcit')")
    with pytest.raises(UserError, match=r'loading it failed \(ImportError: '
                       r'No module named timm.models.xcit\)'):
        published.load_published_code(str(code))
    code.write_text('import torch\nclass XCiT:\n    def __init__(self, '
                    'patch_size=16):\n        pass\n')  # the classifier's
    with pytest.raises(UserError, match='no XCiT class with pyramid taps'):
        published.load_published_code(str(code))
    proc = run_tool_here('tools/benchmark.py', '--models',
                         'xcit_nano_12_p16@published', '--out-dir', tmp_path)
    assert proc.returncode == 2 and '--published-code' in proc.stderr
    proc = run_tool_here('tools/benchmark.py', '--models',
                         'xcit_nano_12_p16@published', '--published-code',
                         code, '--out-dir', tmp_path)
    assert proc.returncode == 2 and 'top-level xcit.py is the classifier' \
        in proc.stderr
    proc = run_tool_here('tools/benchmark.py', '--models',
                         'xcit_nano_12_p16@published+graphs')
    assert proc.returncode == 2 and "takes 'amp' alone" in proc.stderr


def test_each_row_against_the_published_backbone():
    """The second ratio table: every XCiT row against ``@published`` of
    its precision (``@published+amp`` for ``@amp`` rows); detectors are
    not compared with the published backbone."""
    from benchmarks.harness.report import ratio_rows

    def row(model, seconds):
        return dict(model=model, h=64, w=96, batch=1, mode='infer',
                    seconds=seconds, peak_mem_gib=1.0,
                    activation_mem_gib=0.5)

    results = [row('xcit_nano_12_p16@reference', 10.0),
               row('xcit_nano_12_p16@published', 12.0),
               row('xcit_nano_12_p16@published+amp', 16.0),
               row('xcit_nano_12_p16@amp+graphs', 4.0),
               row('xcit_nano_12_p16@graphs', 6.0),
               row('mask_rcnn_xcit_s12', 3.0)]
    speedups = {r['model']: r['speedup']
                for r in ratio_rows(results, 'published')}
    assert speedups == {'xcit_nano_12_p16@reference': 1.2,
                        'xcit_nano_12_p16@amp+graphs': 4.0,
                        'xcit_nano_12_p16@graphs': 2.0}
    # the published row also against the straightforward computation
    assert {r['model']: r['speedup'] for r in ratio_rows(results)}[
        'xcit_nano_12_p16@published'] == 10.0 / 12.0


def test_recorded_rows_of_code_not_ours_and_of_recipes_on_cuda(
        monkeypatch, tmp_path):
    """``--record``'s runs: the published backbone's and the peers' rows
    measure no code of ours (scope null), beside the backbone's rows
    that take them as baselines; a recipe's row on CUDA replays its
    backbone's graphs unless ``@eager``, a backbone's only with
    ``@graphs``; ``@amp`` is fp16 there."""
    import argparse

    from benchmarks import results as res
    from benchmarks.harness import record

    def row(model, seconds, mode='train'):
        return dict(model=model, h=800, w=1344, batch=2, mode=mode,
                    seconds=seconds, peak_mem_gib=1.0,
                    activation_mem_gib=0.5)

    monkeypatch.setattr(record, 'commit', lambda: dict(commit=None))
    doc = dict(device='cuda', argv=['--device', 'cuda'], threads=16,
               machine=dict(gpu='NVIDIA H200', cpu='AMD EPYC',
                            cpu_features=['avx2']),
               matmul=dict(fp32_gflops_per_s=5e4, bf16_gflops_per_s=None),
               results=[row('xcit_small_12_p16@published+amp', 0.08),
                        row('xcit_small_12_p16@amp+graphs', 0.04),
                        row('swin_t', 0.05, 'infer'),
                        row('xcit_small_12_p16@amp', 0.06),
                        row('mask_rcnn_swin_t@amp+iter', 0.2),
                        row('mask_rcnn_xcit_s12@amp+iter', 0.1),
                        row('mask_rcnn_xcit_s12@amp+eager', 0.3)])
    args = argparse.Namespace(repeat=20, warmup=3, rounds=1,
                              published_code='pub/xcit.py')
    written = record.record_runs(doc, args, tmp_path)
    assert [path.name for path, _ in written] == ['gpu-h200.json'] * 2
    runs = res.load(tmp_path)['gpu-h200']['runs']
    assert res.problems(res.load(tmp_path)) == []
    backbone, whole = ({r['name']: (r['variant'], r['precision'],
                                    r['mode'], r.get('scope', 'run'))
                        for r in run['rows']} for run in runs)
    assert backbone == {
        'xcit_small_12_p16@published+amp': ('published', 'fp16 autocast',
                                            'train', None),
        'xcit_small_12_p16@amp+graphs': ('default+graphs', 'fp16 autocast',
                                         'train', 'run'),
        'swin_t': ('peer', 'fp32', 'infer', None),
        'xcit_small_12_p16@amp': ('default', 'fp16 autocast', 'train',
                                  'run')}
    assert whole == {
        'mask_rcnn_swin_t@amp+iter': ('peer', 'fp16 autocast', 'iter',
                                      None),
        'mask_rcnn_xcit_s12@amp+iter': ('default+graphs', 'fp16 autocast',
                                        'iter', 'run'),
        'mask_rcnn_xcit_s12@amp+eager': ('default', 'fp16 autocast',
                                         'train', 'run')}
    graphed = runs[0]['rows'][1]
    assert graphed['ratios'] == [dict(
        baseline='xcit_small_12_p16@published+amp/800x1344/b2/train',
        speedup=2.0, peak_mem=1.0, activation_mem=1.0)]
    assert runs[0]['published_code'] == 'pub/xcit.py'
    assert runs[1]['code']['scope'] == 'whole-model'
    assert runs[0]['matmul_gflops_per_s'] == dict(fp32=5e4, bf16=None)
