"""The export table: whole models on a CPU in PyTorch and as the ONNX files
``tools/export_onnx.py`` writes, run by onnxruntime and OpenVINO in fp32
and INT8, each against PyTorch's eager fp32 in the same run."""
from . import cells
from . import results as res
from .table_kinds import Results, markdown_table, with_note

#: a runtime's variant, as the tables name it (its version: the run's
#: ``libraries`` under the variant's name)
RUNTIMES = {'onnxruntime': 'onnxruntime', 'openvino': 'OpenVINO'}
#: the table's lines, in order: (variant, precision)
LINES = [('default', 'fp32'), ('default', 'bf16 autocast')] + [
    (runtime, precision) for runtime in RUNTIMES
    for precision in ('fp32', 'int8')]
BASELINE = ('default', 'fp32')


def export_cpu(results: Results) -> str:
    """Seconds per image and the speed-up over PyTorch's eager fp32 of the
    same run, one column per model: the newest CPU run of each model that
    measured a runtime."""
    runs = _export_runs(results)
    lines = []
    for kind in LINES:
        cells_of = [_cell(rows, kind, results) for _, rows in runs]
        if any(cells_of):
            lines.append([_label(kind, [run for run, _ in runs])] + cells_of)
    machines = list(dict.fromkeys(row.machine for _, rows in runs
                                  for row in rows.values()))
    named = ', '.join(results.machine(m)['name'] for m in machines)
    threads = ', '.join(sorted({str(run['threads']) for run, _ in runs}))
    header = [f'{named}, {threads} threads, batch 1: seconds per image '
              '(speed-up over PyTorch eager fp32, same run)'] + [
        f"{cells.model(rows[BASELINE]['model'])}, {rows[BASELINE]['size']}"
        for _, rows in runs]
    return with_note(markdown_table(header, lines))


def _export_runs(results: Results) -> list:
    """[(run, {(variant, precision): row})], the newest CPU run per model
    that has a runtime's row and PyTorch's eager fp32 beside it."""
    candidates = {}
    for row in results.rows:
        if row.machine.startswith('cpu-') and row['variant'] in RUNTIMES:
            candidates.setdefault(row['model'], []).append(row.run)
    found = {model: res.newest(runs) for model, runs in candidates.items()}
    runs = []
    for model, run in found.items():
        rows = {(r['variant'], r['precision']): r for r in results.rows
                if r.run is run and r['model'] == model}
        if BASELINE in rows:
            runs.append((run, rows))
    return runs


def _label(kind: tuple, runs: list) -> str:
    variant, precision = kind
    if variant == 'default':
        return 'PyTorch eager, fp32' if precision == 'fp32' else \
            'PyTorch, `AutocastPartsHook` in bf16'
    versions = sorted({run['libraries'].get(variant, '') for run in runs})
    name = ' '.join([RUNTIMES[variant]] + [v for v in versions if v][:1])
    return f"{name}, {'INT8' if precision == 'int8' else precision}"


def _cell(rows: dict, kind: tuple, results: Results) -> str:
    row = rows.get(kind)
    if row is None or 'seconds' not in row.data:
        return ''
    text = cells.mark(f"{row['seconds']:.2f}", row, results.stale)
    if kind == BASELINE:
        return text
    base = rows[BASELINE]
    given = [r for r in row.get('ratios', []) if r['baseline'] == base['id']
             and 'speedup' in r]
    speedup = given[0]['speedup'] if given else \
        base['seconds'] / row['seconds']
    return f'{text} ({speedup:.2f}x)'
