"""Whether the targets (``results/targets.json``) are met by the newest
measurement of each on each machine (:func:`newest_row`).

A target names the row it is judged on (``row``: the fields a results row
must have, such as model, size, batch, mode, precision, variant), the
machines (``machines``: results file names or patterns of them), the
baselines whose ratios its tables show beside (``also``) and its aims,
each one condition:

- ``{"seconds_at_most": s}``: the row's time;
- ``{"speedup_over": variant, "at_least": x}``: the row's ratio to the
  baseline of that variant in its run (``published``, ``straightforward``);
- ``{"peak_mem_over" | "activation_mem_over": variant, "at_most": x}``:
  its memory ratio to that baseline;
- ``{"max_rel_diff_at_most": d}``: its outputs' difference to the
  straightforward computation, relative to their largest value;
- ``{"faster_than": model}``: faster than that model's row of its run
  (same mode, size and batch);
- ``{"all_pass": true}``: a test run with no failure.
"""
from fnmatch import fnmatch

from .results import newest

MET, NOT_MET = 'met', 'not met'
PARTLY, UNMEASURED = 'met where measured', 'not measured'
FIELDS = ('id', 'table', 'what', 'machines', 'row', 'aim')
AIMS = ('seconds_at_most', 'speedup_over', 'peak_mem_over',
        'activation_mem_over', 'max_rel_diff_at_most', 'faster_than',
        'all_pass')


def problems(targets: list, docs: dict) -> list:
    """What a target lacks or gets wrong, one line each."""
    found, ids = [], set()
    for target in targets:
        where = f"targets.json/{target.get('id')}"
        found += [f'{where}: lacks {f!r}' for f in FIELDS
                  if f not in target]
        if target.get('id') in ids:
            found.append(f'{where}: a second target of this id')
        ids.add(target.get('id'))
        if 'machines' in target and not machines_of(target, docs):
            found.append(f'{where}: no results file is named like '
                         f"{target['machines']}")
        found += [f'{where}: an aim of unknown kind {aim}; the kinds: '
                  f"{', '.join(AIMS)}" for aim in target.get('aim', ())
                  if not any(k in aim for k in AIMS)]
    return found


def machines_of(target: dict, docs: dict) -> list:
    """The results files ``target`` is judged on, in the order its
    ``machines`` (a name pattern, or a list of them) gives."""
    patterns = target['machines']
    found = []
    for pattern in [patterns] if isinstance(patterns, str) else patterns:
        found += [m for m in docs if fnmatch(m, pattern) and m not in found]
    return found


def newest_row(target: dict, rows: list, machine: str):
    """The row of ``machine`` that ``target`` is judged on, or None: the
    newest (the latest date; on one date, the run written last) of those
    measured beside every baseline the target names (its aims' and
    ``also``), else the newest of all. A run that timed the row for
    another table (the sizes, say) does not stand in for the one that
    compared it with the published code."""
    matching = [row for row in rows if row.machine == machine and all(
        row.get(k) == v for k, v in target['row'].items())]
    complete = [row for row in matching if all(
        ratio_to(row, variant) for variant in baselines(target))]
    chosen = complete or matching
    return newest(chosen, date=lambda row: row.run['date']) if chosen \
        else None


def baselines(target: dict) -> list:
    """The variants ``target`` compares its row with: its aims' and
    ``also``."""
    named = [aim[key] for aim in target['aim'] for key in (
        'speedup_over', 'peak_mem_over', 'activation_mem_over') if key in aim]
    return list(dict.fromkeys(named + list(target.get('also', ()))))


def ratio_to(row, variant: str):
    """``row``'s ratio to the baseline of ``variant`` in its run, or
    None."""
    for ratio in row.get('ratios', []):
        if row.baseline(ratio)['variant'] == variant:
            return ratio
    return None


def peer_row(row, model: str):
    """The row of ``model`` in ``row``'s run measured as ``row`` was."""
    for other in row.run['rows']:
        if other['model'] == model and all(
                other.get(k) == row.get(k) for k in ('mode', 'size', 'batch')):
            return other
    return None


def holds(aim: dict, row):
    """Whether ``row`` meets ``aim``: True, False, or None where the row
    does not measure it."""
    if 'seconds_at_most' in aim:
        seconds = row.get('seconds')
        return None if seconds is None else seconds <= aim['seconds_at_most']
    if 'max_rel_diff_at_most' in aim:
        diff = row.get('max_rel_diff_vs_reference')
        return None if diff is None else diff <= aim['max_rel_diff_at_most']
    if 'faster_than' in aim:
        peer = peer_row(row, aim['faster_than'])
        if peer is None or None in (peer.get('seconds'), row.get('seconds')):
            return None
        return row['seconds'] < peer['seconds']
    if 'all_pass' in aim:
        return None if 'failed' not in row.data else row['failed'] == 0
    for key, figure in (('speedup_over', 'speedup'),
                        ('peak_mem_over', 'peak_mem'),
                        ('activation_mem_over', 'activation_mem')):
        if key in aim:
            value = (ratio_to(row, aim[key]) or {}).get(figure)
            if value is None:
                return None
            return value >= aim['at_least'] if 'at_least' in aim else \
                value <= aim['at_most']
    raise ValueError(f'an aim of unknown kind: {aim}')


def status(target: dict, row) -> str:
    """``met``, ``not met``, ``met where measured`` (some aims not
    measured), ``not measured``, or '' for a target with no aim."""
    if not target['aim']:
        return ''
    if row is None:
        return UNMEASURED
    found = [holds(aim, row) for aim in target['aim']]
    if False in found:
        return NOT_MET
    if None not in found:
        return MET
    return PARTLY if True in found else UNMEASURED
