"""One function per kind of table, each writing a markdown table (and the
note on stale rows where it marks one) from the results."""
from dataclasses import dataclass
from typing import Callable

from . import cells
from . import results as res
from . import targets as tg


@dataclass
class Results:
    docs: dict  # machine -> its results file
    rows: list  # every Row
    targets: list
    stale: Callable  # Row -> bool

    def machine(self, name: str) -> dict:
        return self.docs[name]['machine']

    def machines(self, prefix='') -> list:
        """The results files whose names start with ``prefix``, in the
        order the targets name them, then the others by name."""
        named = [m for t in self.targets for m in tg.machines_of(
            t, self.docs)]
        return [m for m in dict.fromkeys(named + sorted(self.docs))
                if m.startswith(prefix)]


def markdown_table(header: list, lines: list) -> list:
    """A markdown table's lines, from its header and its lines' cells."""
    out = ['| ' + ' | '.join(header) + ' |',
           '| ' + ' | '.join('---' for _ in header) + ' |']
    return out + ['| ' + ' | '.join(line) + ' |' for line in lines]


def with_note(lines: list) -> str:
    """The lines as text, with the note on stale rows where one is
    marked."""
    text = '\n'.join(lines)
    return text + ('\n\n' + cells.STALE_NOTE if cells.STALE in text else '')


def cpu(results: Results) -> str:
    """README's CPU table: each CPU target, what it aims at, and on each
    kind of CPU the newest measurement of it and whether it is met."""
    chosen = [t for t in results.targets if t['table'] == 'cpu']
    machines = list(dict.fromkeys(
        m for t in chosen for m in tg.machines_of(t, results.docs)))
    lines = [[t['what'], cells.aimed(t, 'cpu')] +
             [_judged(t, m, results) for m in machines] for t in chosen]
    header = ['XCiT-S12/16, 800x1344, batch 1', 'aimed at'] + [
        results.machine(m)['name'] for m in machines]
    return with_note(markdown_table(header, lines))


def _judged(target: dict, machine: str, results: Results) -> str:
    row = tg.newest_row(target, results.rows, machine)
    if row is None:
        return tg.status(target, row)
    text = cells.measured(target, row, results.stale)
    state = tg.status(target, row)
    return f'{text}: **{state}**' if state else text


def gpu(results: Results) -> str:
    """README's GPU table: each GPU target, what it aims at, the newest
    measurement of it and whether it is met."""
    lines = []
    for target in (t for t in results.targets if t['table'] == 'gpu'):
        for machine in tg.machines_of(target, results.docs):
            row = tg.newest_row(target, results.rows, machine)
            lines.append([
                target['what'], cells.aimed(target, machine),
                cells.measured(target, row, results.stale) if row else '',
                tg.status(target, row)])
    first = ', '.join(results.machine(m)['name']
                      for m in results.machines('gpu-'))
    return with_note(markdown_table([first, 'aimed at', 'measured', 'met'],
                                    lines))


def targets(results: Results) -> str:
    """Every target on every machine it names, with the run its
    measurement comes from."""
    lines = []
    for target in results.targets:
        for machine in tg.machines_of(target, results.docs):
            row = tg.newest_row(target, results.rows, machine)
            run = f"{row.run['id']}" if row else ''
            lines.append([
                target['what'], cells.aimed(target, machine),
                results.machine(machine)['name'],
                cells.measured(target, row, results.stale) if row else '',
                f'`{run}`' if run else '', tg.status(target, row)])
    return with_note(markdown_table(['target', 'aimed at', 'machine',
                                     'measured', 'run', 'met'], lines))


def cpu_published(results: Results) -> str:
    """On each kind of CPU, the newest run beside the published code:
    times, memory and ratios to the published code, by variant."""
    columns = [('published', 'fp32'), ('straightforward', 'fp32'),
               ('default', 'fp32'), ('default', 'bf16 autocast')]
    lines = []
    for machine in results.machines('cpu-'):
        runs = [r.run for r in results.rows if r.machine == machine
                and r['variant'] == 'published']
        if not runs:
            continue
        run = res.newest(runs)
        for mode in ('infer', 'train'):
            found = {(r['variant'], r['precision']): r for r in results.rows
                     if r.run is run and r['mode'] == mode}
            lines.append([f"{results.machine(machine)['name']}, "
                          f"{_MODES[mode]} ({run['date']})"] +
                         [_against_published(found.get(c), results)
                          for c in columns])
    return with_note(markdown_table(
        ['XCiT-S12/16, 800x1344, batch 1 (ratios: to the published code, '
         'same run)', 'published code',
         'straightforward, fp32', 'default, fp32',
         'default, bf16 autocast'], lines))


_MODES = dict(infer='inference', train='training step')


def _against_published(row, results: Results) -> str:
    if row is None:
        return ''
    parts = []
    if 'seconds' in row.data:
        parts.append(cells.seconds(row['seconds'], row.machine))
    for key in ('peak_mem_gib', 'activation_mem_gib'):
        if key in row.data:
            what = 'peak' if key == 'peak_mem_gib' else 'activations'
            parts.append(f'{cells.gib(row[key])} {what}')
    found = tg.ratio_to(row, 'published')
    if found:
        rounds = found.get('rounds')
        parts.append(f"{found['speedup']:.2f}x" + (
            ' (rounds ' + ', '.join(f'{r:.2f}' for r in rounds) + ')'
            if rounds else ''))
    if not parts:
        parts.append(row.get('note', ''))
    parts[0] = cells.mark(parts[0], row, results.stale)
    return ', '.join(parts)


def cpu_scaling(results: Results) -> str:
    """Inference time by input size (batch 1), from the CPU run with the
    most sizes (the newest of several): each model's seconds and peak
    memory per size, and the largest size's time over the one with a
    quarter of its pixels."""
    runs = {id(r.run): r.run for r in results.rows
            if r.machine.startswith('cpu-') and r['mode'] == 'infer'}
    most = max(len(_sizes(run)) for run in runs.values())
    run = res.newest(run for run in runs.values()
                     if len(_sizes(run)) == most)
    sizes = sorted(_sizes(run), key=_pixels)
    found = {(r['name'], r['size']): r for r in results.rows
             if r.run is run and r['batch'] == 1}
    names = list(dict.fromkeys(n for n, _ in found))
    small, large = _quarter(sizes)
    lines = []
    for name in names:
        row = found[(name, sizes[0])]
        line = [cells.described(row)]
        for size in sizes:
            cell = found.get((name, size))
            line.append(_size_cell(cell, results) if cell else '')
        both = [found.get((name, s)) for s in (small, large)]
        line.append(f"{both[1]['seconds'] / both[0]['seconds']:.2f}"
                    if all(r and 'seconds' in r.data for r in both) else '')
        lines.append(line)
    machine = results.machine(next(r.machine for r in results.rows
                                   if r.run is run))['name']
    header = [f"{machine}, {run['date']}: seconds (peak GiB)", *sizes,
              f'{large} / {small}']
    return with_note(markdown_table(header, lines))


def _sizes(run: dict) -> set:
    return {r['size'] for r in run['rows'] if r['batch'] == 1}


def _pixels(size: str) -> int:
    h, w = map(int, size.split('x'))
    return h * w


def _quarter(sizes: list):
    """The largest size and the size with a quarter of its pixels."""
    large = sizes[-1]
    small = min(sizes, key=lambda s: abs(4 * _pixels(s) - _pixels(large)))
    return small, large


def _size_cell(row, results: Results) -> str:
    if 'error' in row.data:
        return row['error']
    text = f"{row['seconds']:.2f}"
    if 'peak_mem_gib' in row.data:
        text += f" ({row['peak_mem_gib']:.2f})"
    return cells.mark(text, row, results.stale)


def rows_of(results: Results, machine: str) -> str:
    """Every row of one results file, run by run, then each run's date,
    commit, libraries and command."""
    lines, runs = [], []
    for row in (r for r in results.rows if r.machine == machine):
        if not runs or runs[-1] is not row.run:
            runs.append(row.run)
        lines.append([f"`{row.run['id']}`", cells.described(row),
                      ', '.join(str(row[k]) for k in ('size', 'batch')
                                if row.get(k) is not None),
                      row['mode'], _time(row, results),
                      _memory(row), _ratios(row)])
    table = markdown_table(['run', 'measured', 'input, batch', 'mode',
                            'time', 'memory', 'against'], lines)
    return with_note(table + [''] + [_run_line(run) for run in runs])


def _time(row, results: Results) -> str:
    if row['mode'] == 'tests':
        text = cells.tests(row)
    elif row['mode'] == 'demo':
        text = cells.demo(row)
    elif 'seconds' in row.data:
        text = cells.seconds(row['seconds'], row.machine)
    else:
        return row.get('error', '')
    return cells.mark(text, row, results.stale)


def _memory(row) -> str:
    parts = [f'{cells.gib(row[k])} {what}' for k, what in (
        ('peak_mem_gib', 'peak'), ('activation_mem_gib', 'activations'),
        ('peak_reserved_gib', 'reserved')) if k in row.data]
    return ', '.join(parts)


def _ratios(row) -> str:
    return '; '.join(cells.ratio(row, r, rounds=True)
                     for r in row.get('ratios', []))


def _run_line(run: dict) -> str:
    libraries = ', '.join(f'{k} {v}' for k, v in run['libraries'].items())
    commit = f"commit {run['commit']}" if run['commit'] else \
        'commit not recorded'
    return (f"- `{run['id']}`: {run['date']}, {commit}, {run['threads']} "
            f"threads, {libraries}: `{run['command']}`")


def optimizer_step(results: Results) -> str:
    """A recipe's optimizer step with mmengine's one parameter group per
    parameter (``merge_groups=False``) and with the groups merged (our
    constructor's default), on each machine that measured it."""
    lines = [[results.machine(row.machine)['name'], cells.model(row['model']),
              f"`{row['name']}`", _time(row, results), _ratios(row)]
             for row in results.rows if row['mode'] == 'optimizer step']
    return with_note(markdown_table(
        ['machine', 'model', 'parameter groups', 'step', 'against'], lines))


def machines(results: Results) -> str:
    """Each results file: its machine, its runs and rows, and how many of
    them are older than the code."""
    lines = []
    for name in results.machines():
        doc = results.docs[name]
        found = [r for r in results.rows if r.machine == name]
        machine = doc['machine']
        features = ', '.join(machine.get('cpu_features', ()))
        described = f"{machine['gpu']}, a host of {machine['cores']} " \
            'cores' if machine.get('gpu') else \
            f"{machine['cpu']} ({features}), {machine['cores']} cores"
        lines.append([
            f'`benchmarks/results/{name}.json`', machine['name'],
            described, str(len(doc['runs'])),
            str(len(found)), str(sum(map(results.stale, found)))])
    return '\n'.join(markdown_table(
        ['results', 'machine', 'processor', 'runs', 'rows',
         'rows older than the code'], lines))
