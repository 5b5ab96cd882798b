"""The tables of README.md and docs/ are generated from
benchmarks/results/: a table that differs from the results, a marker that
names no table and a results row without its fields fail; a row measured
before a change to its code is marked."""
import copy
import json

import pytest

from benchmarks import results as res
from benchmarks import tables
from benchmarks.cells import STALE, STALE_NOTE
from benchmarks.fingerprint import code_fingerprint
from benchmarks.targets import MET, NOT_MET, UNMEASURED, newest_row, status

RUN = dict(
    id='run', date='2026-01-02', commit='abc1234', command='python x',
    threads=2, libraries=dict(torch='2.12.1'),
    code=dict(scope='backbone', fingerprint='0123456789abcdef'),
    rows=[dict(id='slow', name='m@reference', model='m',
               variant='straightforward', precision='fp32', mode='infer',
               size='64x64', batch=1, seconds=2.0),
          dict(id='fast', name='m', model='m', variant='default',
               precision='fp32', mode='infer', size='64x64', batch=1,
               seconds=1.0, ratios=[dict(baseline='slow', speedup=2.0)]),
          dict(id='peer', name='p', model='p', variant='peer',
               precision='fp32', mode='infer', size='64x64', batch=1,
               seconds=3.0, scope=None)])
MACHINE = dict(name='A CPU', cpu='A CPU', cpu_features=['avx2'], cores=2)
TARGET = dict(id='t', table='cpu', what='inference', machines='cpu-*',
              row=dict(model='m', variant='default', mode='infer'),
              aim=[dict(speedup_over='straightforward', at_least=1.5)])


def demo_row(seed, metrics, wall_s=None, precision='fp32'):
    return dict(id=f'seed{seed}', name='demo_mask_rcnn', model='mask_rcnn',
                variant='default', precision=precision, mode='demo',
                size='128x128', batch=4, seed=seed, wall_s=wall_s,
                metrics=dict(zip(res.DEMO_METRICS['coco'], metrics)))


def demo_run(id, command, rows, date='2026-01-02'):
    return dict(RUN, id=id, command=command, date=date, rows=rows,
                code=dict(scope='whole-model',
                          fingerprint='0123456789abcdef'))


#: the COCO demo: seed 0 by make and seeds 1-3 by train.py on a CPU, seed
#: 0 by make on a GPU after an earlier run of it
DEMOS = {
    'cpu-test': dict(machine=MACHINE, runs=[
        demo_run('seeds', 'python tools/train.py configs/d.py --work-dir '
                 'w --cfg-options randomness.seed=N',
                 [demo_row(1, (0.319, 0.524, 0.337, 0.530)),
                  demo_row(2, (0.350, 0.577, 0.364, 0.569)),
                  demo_row(3, (0.327, 0.528, 0.338, 0.515))]),
        demo_run('make', 'make demo', [
            demo_row(0, (0.309, 0.536, 0.343, 0.525), wall_s=638)])]),
    'gpu-test': dict(machine=dict(name='A GPU', gpu='A GPU', cores=16),
                     runs=[demo_run('old', 'make demo PY=python3',
                                    [demo_row(0, (0.1,) * 4, wall_s=1)]),
                           demo_run('new', 'make demo PY=python3',
                                    [demo_row(0, (0.33, 0.5, 0.35, 0.55),
                                              wall_s=148)],
                                    date='2026-01-03')])}


def results_of(doc=None, fingerprint='0123456789abcdef', target=TARGET,
               docs=None):
    doc = doc or dict(machine=MACHINE, runs=[RUN])
    docs = docs or {'cpu-test': doc}
    return tables.kinds.Results(
        docs, res.rows(docs), [target],
        lambda row: res.is_stale(row, fingerprint=lambda s: fingerprint))


def test_the_docs_tables_are_what_the_results_give():
    """README.md and docs/*.md against benchmarks/results/, as
    ``python -m benchmarks.tables --check`` compares them."""
    assert tables.run(check=True) == []


def test_a_differing_table_and_an_unknown_name_fail(tmp_path):
    (tmp_path / 'docs').mkdir()
    doc = tmp_path / 'docs' / 'a.md'
    text = ('<!-- table: rows-cpu-test -->\nold\n<!-- /table -->\n'
            '<!-- table: nonesuch -->\n<!-- /table -->\n')
    doc.write_text(text)
    found = tables.run(check=True, root=tmp_path, results=results_of())
    assert any("'rows-cpu-test' differs" in p for p in found)
    assert any("'nonesuch'" in p for p in found)
    assert doc.read_text() == text  # a check writes nothing
    tables.run(check=False, root=tmp_path, results=results_of())
    assert '| `run` | m, default, fp32 |' in doc.read_text()
    assert tables.run(check=True, root=tmp_path, results=results_of()) \
        == ["docs/a.md: no table is named 'nonesuch'; the tables: cpu, gpu, "
            'targets, cpu-published, cpu-scaling, machines, export-cpu, '
            'optimizer-step, demo-coco, demo-coco-runs, demo-ade20k, '
            'demo-ade20k-runs, demo-ade20k-classes, rows-cpu-test']


def test_a_results_row_without_its_fields_fails():
    doc = dict(machine=MACHINE, runs=[copy.deepcopy(RUN)])
    assert res.problems({'cpu-test': doc}) == []
    rows = doc['runs'][0]['rows']
    del rows[1]['mode']
    rows[1]['ratios'][0]['baseline'] = 'gone'
    del rows[2]['seconds']
    del rows[2]['scope']
    del doc['runs'][0]['libraries']['torch']
    assert res.problems({'cpu-test': doc}) == [
        'cpu-test/run: libraries lack torch',
        "cpu-test/run/fast: row lacks 'mode'",
        "cpu-test/run/fast: baseline 'gone' is no row of its run",
        'cpu-test/run/peer: row has no figure (seconds, ratios, passed, '
        'metrics, error) and is no baseline',
        'cpu-test/run/peer: a peer row measures no code of ours: its scope '
        'is null']


def test_a_demo_row_without_its_metrics_fails():
    docs = copy.deepcopy(DEMOS)
    assert res.problems(docs) == []
    rows = docs['cpu-test']['runs'][0]['rows']
    del rows[0]['metrics']
    rows[1]['metrics']['mIoU'] = 40.0
    docs['gpu-test']['runs'][0]['code']['scope'] = 'backbone'
    assert res.problems(docs) == [
        "cpu-test/seeds/seed1: row lacks 'metrics'",
        'cpu-test/seeds/seed1: row has no figure (seconds, ratios, passed, '
        'metrics, error) and is no baseline',
        'cpu-test/seeds/seed2: metrics must be the numbers of {bbox_mAP, '
        'bbox_mAP_50, segm_mAP, segm_mAP_50} or {aAcc, mIoU, mAcc}',
        "gpu-test/old/seed0: a demo measures the whole model: its scope is "
        "'whole-model'"]


def test_the_demo_tables_take_the_newest_run_and_the_seeds_spread(
        tmp_path):
    """The README's table: seed 0 by make on the CPU with the most seeds,
    the median (min - max) over them, the GPU's newest run by make;
    docs/demo.md's: every seed and machine, the command's seed filled in."""
    results = results_of(docs=DEMOS)
    assert tables.table('demo-coco', results).split('\n')[2:] == [
        '| A CPU (2 cores), `make demo`, fp32, seed 0 | 0.309 | 0.536 | '
        '0.343 | 0.525 | 10 min 38 s |',
        '| 4 seeds on it, median (min - max) | 0.323 (0.309 - 0.350) | '
        '0.532 (0.524 - 0.577) | 0.341 (0.337 - 0.364) | '
        '0.528 (0.515 - 0.569) |  |',
        '| A GPU, `make demo PY=python3`, fp32 | 0.330 | 0.500 | 0.350 | '
        '0.550 | 2 min 28 s |']
    runs = tables.table('demo-coco-runs', results)
    assert '| A CPU (2 cores) | `python tools/train.py CONFIG --cfg-options ' \
        'randomness.seed=2`, fp32 | 2 | 0.350 |' in runs
    assert '0.100' not in runs and STALE not in runs
    doc = tmp_path / 'docs' / 'demo.md'
    doc.parent.mkdir()
    doc.write_text('<!-- table: demo-coco-runs -->\n<!-- /table -->\n')
    assert tables.run(check=False, root=tmp_path, results=results) == []
    assert doc.read_text() == ('<!-- table: demo-coco-runs -->\n' + runs +
                               '\n<!-- /table -->\n')
    stale = results_of(docs=DEMOS, fingerprint='fedcba9876543210')
    assert '| 0.323' + STALE + ' (0.309 - 0.350) |' in tables.table(
        'demo-coco', stale)


def test_the_export_table_sets_each_runtime_beside_pytorch():
    """The newest run of a model with a runtime's rows: each row's seconds
    and its speed-up over PyTorch's eager fp32 of that run (the run's
    ratio where it gave one, else the times'), the runtime's version."""
    def row(id, variant, precision, seconds, **more):
        return dict(id=id, name=id, model='mask_rcnn_xcit_s12',
                    variant=variant, precision=precision, mode='infer',
                    size='64x64', batch=1, seconds=seconds, **more)
    new = dict(RUN, id='new', date='2026-01-03',
               libraries=dict(torch='2.12.1', openvino='2026.4.1'),
               rows=[row('eager', 'default', 'fp32', 3.0),
                     row('ort', 'onnxruntime', 'fp32', 2.0),
                     row('ov8', 'openvino', 'int8', 1.0, ratios=[
                         dict(baseline='eager', speedup=2.9)])])
    old = dict(RUN, id='old', rows=[row('eager', 'default', 'fp32', 9.0),
                                    row('ov', 'openvino', 'fp32', 1.0)])
    results = results_of(dict(machine=MACHINE, runs=[old, new]))
    assert tables.table('export-cpu', results).split('\n')[2:] == [
        '| PyTorch eager, fp32 | 3.00 |',
        '| onnxruntime, fp32 | 2.00 (1.50x) |',
        '| OpenVINO 2026.4.1, INT8 | 1.00 (2.90x) |']


@pytest.mark.parametrize('fingerprint,marked', [
    ('0123456789abcdef', False), ('fedcba9876543210', True)])
def test_a_row_measured_before_its_code_changed_is_marked(fingerprint,
                                                          marked):
    results = results_of(fingerprint=fingerprint)
    text = tables.table('rows-cpu-test', results)
    assert ('| 1.000 s' + STALE + ' |' in text) is marked
    assert (STALE_NOTE in text) is marked
    assert '| 3.000 s |' in text  # a peer's code is never ours to change
    assert (f'2.00x the straightforward computation{STALE}: **met**' in
            tables.table('cpu', results)) is marked


def test_a_row_of_unknown_code_is_marked():
    doc = dict(machine=MACHINE, runs=[copy.deepcopy(RUN)])
    doc['runs'][0]['code']['fingerprint'] = 'unknown'
    assert STALE_NOTE in tables.table('rows-cpu-test', results_of(doc))


def test_targets_are_judged_on_the_newest_row():
    results = results_of()
    row = newest_row(TARGET, results.rows, 'cpu-test')
    assert row['id'] == 'fast' and status(TARGET, row) == MET
    harder = dict(TARGET, aim=[dict(speedup_over='straightforward',
                                    at_least=2.5)])
    assert status(harder, row) == NOT_MET
    other = dict(TARGET, aim=[dict(speedup_over='published', at_least=1)])
    assert status(other, row) == UNMEASURED
    later = copy.deepcopy(RUN)
    later.update(id='later', date='2026-01-03')
    later['rows'][1]['ratios'][0]['speedup'] = 1.2
    doc = dict(machine=MACHINE, runs=[RUN, later])
    row = newest_row(TARGET, results_of(doc).rows, 'cpu-test')
    assert row.run['id'] == 'later' and status(TARGET, row) == NOT_MET


def test_targets_prefer_the_newest_row_beside_every_baseline_they_name():
    """A later run that timed the row against the straightforward
    computation alone does not replace the run beside the published code
    for a target that shows both; a target that names only the
    straightforward computation takes the later run."""
    beside = copy.deepcopy(RUN)
    beside['rows'].append(dict(RUN['rows'][0], id='pub', name='m@published',
                               variant='published', seconds=3.0))
    beside['rows'][1]['ratios'].append(dict(baseline='pub', speedup=3.0))
    alone = copy.deepcopy(RUN)
    alone.update(id='alone', date='2026-01-03')
    doc = dict(machine=MACHINE, runs=[beside, alone])
    rows = results_of(doc).rows
    shown = dict(TARGET, also=['published'])
    assert newest_row(shown, rows, 'cpu-test').run['id'] == 'run'
    assert newest_row(TARGET, rows, 'cpu-test').run['id'] == 'alone'
    # where no run compared it with all of them, the newest row
    doc = dict(machine=MACHINE, runs=[RUN, alone])
    assert newest_row(shown, results_of(doc).rows,
                      'cpu-test').run['id'] == 'alone'


def test_the_published_table_takes_the_run_recorded_last_on_its_date():
    """Two runs beside the published code on one day: the one appended
    last is the newest (the first was the table's pick)."""
    def run(id, seconds):
        published = dict(RUN['rows'][0], id='pub', name='m@published',
                         variant='published', seconds=seconds)
        return dict(copy.deepcopy(RUN), id=id, rows=[published])
    doc = dict(machine=MACHINE, runs=[run('first', 7.0), run('second', 9.0)])
    table = tables.table('cpu-published', results_of(doc))
    assert '9.000 s' in table and '7.000 s' not in table, table


def test_the_scaling_table_takes_the_newest_run_of_the_most_sizes():
    """Of two runs at the most sizes, the newer (the older was the table's
    pick); a newer run at fewer sizes is not a scaling run."""
    def run(id, date, seconds, sizes=('64x64', '128x128')):
        return dict(copy.deepcopy(RUN), id=id, date=date, rows=[
            dict(RUN['rows'][1], id=f'm{size}', size=size, seconds=seconds)
            for size in sizes])
    doc = dict(machine=MACHINE, runs=[
        run('old', '2026-01-02', 7.0), run('new', '2026-01-03', 9.0),
        run('one size', '2026-01-04', 5.0, sizes=('64x64', ))])
    table = tables.table('cpu-scaling', results_of(doc))
    assert 'A CPU, 2026-01-03' in table and '| 9.00' in table, table
    assert '7.00' not in table and '5.00' not in table, table


def test_the_fingerprint_is_of_the_code_not_its_prose(tmp_path):
    models = tmp_path / 'xcit_dense' / 'models'
    models.mkdir(parents=True)
    source = models / 'part.py'
    source.write_text('def f(x):\n    return x + 1\n')
    first = code_fingerprint('backbone', tmp_path)
    source.write_text('"""A module."""\n\n\ndef f(x):  # one more\n'
                      '    """Adds one."""\n    return (x +\n            1)\n')
    assert code_fingerprint('backbone', tmp_path) == first
    source.write_text('def f(x):\n    return x + 2\n')
    assert code_fingerprint('backbone', tmp_path) != first
    (tmp_path / 'xcit_dense' / 'tools.py').write_text('y = 1\n')
    source.write_text('def f(x):\n    return x + 1\n')
    assert code_fingerprint('backbone', tmp_path) == first


def test_results_files_are_written_as_they_are_read(tmp_path):
    """``dumps`` is how the files are written: each reads back equal and
    is already in that form."""
    for path in sorted(res.RESULTS.glob('*.json')):
        assert res.dumps(json.loads(path.read_text())) == path.read_text()
    written = res.add_run(copy.deepcopy(RUN), MACHINE, tmp_path)
    assert written.name == 'cpu-a-avx2.json'
    assert res.load(tmp_path)['cpu-a-avx2']['runs'] == [RUN]


def test_a_machine_is_named_by_its_results_file():
    """The file a new run of a machine goes to is the one its kind of
    machine has (``add_run``)."""
    for machine, doc in res.load().items():
        assert res.results_file(doc['machine']) == machine
