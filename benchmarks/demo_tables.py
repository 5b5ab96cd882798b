"""The demos' tables (``make demo``, ``make demo-ade20k``): each run's
metrics and time, and the spread over seeds on the reference CPU (the CPU
with the most seeds of the demo).

A machine's run of a demo is the newest row for its command, precision
and seed: a run repeated on the same code replaces the earlier one.
"""
from decimal import Decimal
from statistics import median

from . import cells
from .results import DEMO_METRICS, demo_kind
from .table_kinds import Results, markdown_table, with_note

#: each demo's evaluator (a key of DEMO_METRICS) and its tables' header
DEMOS = {
    'coco': '`make demo`: Mask R-CNN XCiT-N12/16, 800 iterations of 4 '
            'images',
    'ade20k': '`make demo-ade20k`: UperNet XCiT-N12/16, 600 iterations '
              'of 8 images',
}


def newest_runs(results: Results, kind: str) -> list:
    """The demo rows of ``kind``, the newest for each machine, command,
    precision and seed; by machine (the results' order), then date."""
    found = {}
    for row in (r for r in results.rows if r['mode'] == 'demo'
                and demo_kind(r) == kind):
        key = (row.machine, row.run['command'], row['precision'],
               row['seed'])
        if key not in found or row.run['date'] >= found[key].run['date']:
            found[key] = row
    order = results.machines()
    return sorted(found.values(), key=lambda r: (
        order.index(r.machine), r.run['date'], r['seed']))


def reference(rows: list) -> str:
    """The CPU whose rows cover the most seeds (the first such)."""
    seeds = {}
    for row in rows:
        if row.machine.startswith('cpu-'):
            seeds.setdefault(row.machine, set()).add(row['seed'])
    return max(seeds, key=lambda m: len(seeds[m]), default=None)


def _by_make(row) -> bool:
    return row.run['command'].startswith('make ')


def where(row, results: Results) -> str:
    """``AMD EPYC with AVX-512 (2 cores)``, ``NVIDIA H200``."""
    machine = results.machine(row.machine)
    return machine['name'] if machine.get('gpu') else \
        f"{machine['name']} ({machine['cores']} cores)"


def how(row) -> str:
    """The command in backquotes (its config's path left out, its seed
    filled in), then the precision: `make demo`, fp32."""
    command = _short(row.run['command']).replace(
        'seed=N', f"seed={row['seed']}")
    return f"`{command}`, {row['precision']}"


def _short(command: str) -> str:
    """The command without its config's path and work directory."""
    words = command.split()
    if 'tools/train.py' in command or 'tools/dist_train.sh' in command:
        words = [w if not w.startswith('configs/') else 'CONFIG'
                 for w in words]
        while '--work-dir' in words:
            at = words.index('--work-dir')
            del words[at:at + 2]
    return ' '.join(words)


def _line(row, results: Results, first: list) -> list:
    figures = [cells.metric(k, v) for k, v in row['metrics'].items()]
    figures[0] = cells.mark(figures[0], row, results.stale)
    took = cells.duration(row['wall_s'])
    if took and row.run.get('beside'):
        took += f", beside {row.run['beside']}"
    return first + figures + [took]


def _spread(rows: list, results: Results, kind: str) -> list:
    """Each metric's median (min - max) over ``rows`` (one per seed)."""
    line = []
    for name in DEMO_METRICS[kind]:
        values = [Decimal(str(r['metrics'][name])) for r in rows]
        line.append(f'{cells.metric(name, median(values))} '
                    f'({cells.metric(name, min(values))} - '
                    f'{cells.metric(name, max(values))})')
    if any(map(results.stale, rows)):
        line[0] = line[0].replace(' (', cells.STALE + ' (', 1)
    return line


def _seed_rows(rows: list, machine: str) -> list:
    """The reference CPU's rows, one per seed (a ``make`` run first)."""
    found = {}
    for row in sorted(rows, key=_by_make):
        if row.machine == machine and row['precision'] == 'fp32':
            found[row['seed']] = row
    return [found[seed] for seed in sorted(found)]


def _header(kind: str, first: list) -> list:
    return first + [cells.METRICS[k][0] for k in DEMO_METRICS[kind]] + [
        'time']


def summary(results: Results, kind: str) -> str:
    """README's table: seed 0 by ``make`` on the reference CPU, the
    spread over its seeds, and each GPU's run by ``make``."""
    rows = newest_runs(results, kind)
    machine = reference(rows)
    seeds = _seed_rows(rows, machine)
    lines = [_line(r, results, [f'{where(r, results)}, {how(r)}, seed 0'])
             for r in rows
             if r.machine == machine and _by_make(r) and r['seed'] == 0]
    if len(seeds) > 1:
        lines.append([f'{len(seeds)} seeds on it, median (min - max)'] +
                     _spread(seeds, results, kind) + [''])
    lines += [_line(r, results, [f'{where(r, results)}, {how(r)}'])
              for r in rows if r.machine.startswith('gpu-') and _by_make(r)]
    return with_note(markdown_table(_header(kind, [DEMOS[kind]]), lines))


def every_run(results: Results, kind: str) -> str:
    """docs/demo.md's table: each seed on the reference CPU and their
    spread, then every other machine's runs."""
    rows = newest_runs(results, kind)
    seeds = _seed_rows(rows, reference(rows))

    def first(row):
        return [where(row, results), how(row), str(row['seed'])]
    lines = [_line(r, results, first(r)) for r in seeds]
    if len(seeds) > 1:
        lines.append(['', f'{len(seeds)} seeds, median (min - max)', ''] +
                     _spread(seeds, results, kind) + [''])
    lines += [_line(r, results, first(r)) for r in rows if r not in seeds]
    return with_note(markdown_table(
        _header(kind, ['machine', 'run', 'seed']), lines))


def classes(results: Results, kind: str) -> str:
    """The IoU of each class, for the runs that recorded it."""
    rows = [r for r in newest_runs(results, kind) if r.get('class_iou')]
    names = list(dict.fromkeys(c for r in rows for c in r['class_iou']))
    lines = []
    for row in rows:
        values = [f"{row['class_iou'][c]:.1f}" if c in row['class_iou']
                  else '' for c in names]
        values[0] = cells.mark(values[0], row, results.stale)
        lines.append([where(row, results), how(row), str(row['seed'])] +
                     values)
    return with_note(markdown_table(
        ['machine', 'run', 'seed'] + [f'{c} IoU' for c in names], lines))


#: table name -> function of the results writing it
TABLES = {
    'demo-coco': lambda results: summary(results, 'coco'),
    'demo-coco-runs': lambda results: every_run(results, 'coco'),
    'demo-ade20k': lambda results: summary(results, 'ade20k'),
    'demo-ade20k-runs': lambda results: every_run(results, 'ade20k'),
    'demo-ade20k-classes': lambda results: classes(results, 'ade20k'),
}
