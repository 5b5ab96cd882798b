"""The measurements as data: ``benchmarks/results/<machine>.json``, one
file per kind of machine (schema: ``benchmarks/results/README.md``).

A file holds its ``machine`` and its ``runs``; a run (one command) holds
what its rows share (date, commit, command, threads, library versions,
the fingerprint of the code it measured) and its ``rows``. A ratio names
its baseline row of the same run. A row is stale when its code's
fingerprint is not the current tree's (:func:`is_stale`): the tables mark
it as measured before a later change to the code it measures.
"""
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from .fingerprint import SCOPES, UNKNOWN, code_fingerprint

RESULTS = Path(__file__).resolve().parent / 'results'
TARGETS = 'targets.json'

MACHINE_FIELDS = ('name', 'cores')
RUN_FIELDS = ('id', 'date', 'commit', 'command', 'threads', 'libraries',
              'code', 'rows')
ROW_FIELDS = ('id', 'name', 'model', 'variant', 'precision', 'mode', 'size',
              'batch')
TESTS_FIELDS = ('id', 'name', 'mode', 'passed', 'failed', 'skipped')
#: a demo's run (mode ``demo``): a config trained and evaluated
DEMO_FIELDS = ROW_FIELDS + ('seed', 'metrics', 'wall_s')
#: the metrics a demo row holds: those of one of these evaluators
DEMO_METRICS = {
    'coco': ('bbox_mAP', 'bbox_mAP_50', 'segm_mAP', 'segm_mAP_50'),
    'ade20k': ('aAcc', 'mIoU', 'mAcc'),
}
#: a row holds at least one of these, or is another row's baseline
FIGURES = ('seconds', 'ratios', 'passed', 'metrics', 'error')
#: variants that run no code of ours (their rows' scope is null)
NOT_OURS = ('published', 'peer')


@dataclass(frozen=True)
class Row:
    """A row with the run and the machine file it belongs to."""
    machine: str  # the results file's name without .json
    run: dict
    data: dict

    def __getitem__(self, key):
        return self.data[key]

    def get(self, key, default=None):
        return self.data.get(key, default)

    @property
    def ref(self) -> str:
        return f"{self.machine}/{self.run['id']}/{self.data['id']}"

    @property
    def scope(self):
        """The code scope it measures; None for code not ours (the
        published code, a peer's backbone)."""
        return self.data.get('scope', self.run['code']['scope'])

    def baseline(self, ratio: dict) -> 'Row':
        return Row(self.machine, self.run,
                   _by_id(self.run)[ratio['baseline']])


def _by_id(run: dict) -> dict:
    return {r['id']: r for r in run['rows']}


def load(directory=RESULTS) -> dict:
    """``{machine: its results file}`` for every results file."""
    return {p.stem: json.loads(p.read_text())
            for p in sorted(Path(directory).glob('*.json'))
            if p.name != TARGETS}


def load_targets(directory=RESULTS) -> list:
    return json.loads((Path(directory) / TARGETS).read_text())['targets']


def rows(docs: dict) -> list:
    """Every row of ``docs`` (from :func:`load`), file by file, in order."""
    return [Row(machine, run, row) for machine, doc in docs.items()
            for run in doc['runs'] for row in run['rows']]


def newest(runs, date=lambda run: run['date']):
    """The newest of ``runs`` (in their results file's order): the latest
    ``date``, and of runs of the same date the one appended last (rows,
    with ``date=lambda row: row.run['date']``: the last row of it)."""
    return max(reversed(list(runs)), key=date)


@functools.lru_cache(maxsize=None)
def current_fingerprint(scope: str) -> str:
    """The working tree's fingerprint of ``scope`` (once per process)."""
    return code_fingerprint(scope)


def is_stale(row: Row, fingerprint=current_fingerprint) -> bool:
    """Whether ``row`` was measured on code other than the current tree's
    (or on code that cannot be told any more: fingerprint unknown)."""
    if row.scope is None:
        return False
    measured = row.run['code'].get('fingerprint', UNKNOWN)
    return measured in (None, UNKNOWN) or measured != fingerprint(row.scope)


def problems(docs: dict) -> list:
    """What a results file lacks or gets wrong, one line each."""
    found = []
    for machine, doc in docs.items():
        found += [f'{machine}: machine lacks {f!r}' for f in MACHINE_FIELDS
                  if f not in doc.get('machine', {})]
        seen = set()
        for run in doc.get('runs', []):
            found += _run_problems(machine, run, seen)
    return found


def _run_problems(machine: str, run: dict, seen: set) -> list:
    where = f"{machine}/{run.get('id')}"
    found = [f'{where}: run lacks {f!r}' for f in RUN_FIELDS if f not in run]
    if run.get('id') in seen:
        found.append(f'{where}: a second run of this id')
    seen.add(run.get('id'))
    if not re.fullmatch(r'\d{4}-\d\d-\d\d', str(run.get('date'))):
        found.append(f'{where}: date {run.get("date")!r} is not YYYY-MM-DD')
    if run.get('code', {}).get('scope') not in SCOPES:
        found.append(f'{where}: code scope must be one of '
                     f'{", ".join(SCOPES)}')
    if 'torch' not in run.get('libraries', {}):
        found.append(f'{where}: libraries lack torch')
    ids = [r.get('id') for r in run.get('rows', [])]
    baselines = {rt.get('baseline') for r in run.get('rows', [])
                 for rt in r.get('ratios', [])}
    for row in run.get('rows', []):
        need = dict(tests=TESTS_FIELDS, demo=DEMO_FIELDS).get(
            row.get('mode'), ROW_FIELDS)
        found += [f"{where}/{row.get('id')}: row lacks {f!r}" for f in need
                  if f not in row]
        if row.get('mode') == 'demo':
            found += _demo_problems(f"{where}/{row.get('id')}", row, run)
        if not any(f in row for f in FIGURES) and row.get(
                'id') not in baselines:
            found.append(f"{where}/{row.get('id')}: row has no figure "
                         f'({", ".join(FIGURES)}) and is no baseline')
        if row.get('variant') in NOT_OURS and row.get(
                'scope', run.get('code', {}).get('scope')) is not None:
            found.append(f"{where}/{row.get('id')}: a {row['variant']} "
                         'row measures no code of ours: its scope is null')
        found += [f"{where}/{row.get('id')}: baseline "
                  f"{rt.get('baseline')!r} is no row of its run"
                  for rt in row.get('ratios', [])
                  if rt.get('baseline') not in ids]
    if len(set(ids)) != len(ids):
        found.append(f'{where}: row ids repeat')
    return found


def demo_kind(row) -> str:
    """The evaluator (a key of :data:`DEMO_METRICS`) whose metrics a demo
    row holds; None if they are no evaluator's."""
    keys = set(row.get('metrics') or ())
    return next((kind for kind, names in DEMO_METRICS.items()
                 if keys == set(names)), None)


def _demo_problems(where: str, row: dict, run: dict) -> list:
    found = []
    metrics = row.get('metrics')
    if metrics is not None and (demo_kind(row) is None or not all(
            isinstance(v, (int, float)) for v in metrics.values())):
        found.append(f'{where}: metrics must be the numbers of ' + ' or '.join(
            '{' + ', '.join(names) + '}' for names in DEMO_METRICS.values()))
    if not isinstance(row.get('wall_s', 0), (int, float, type(None))):
        found.append(f'{where}: wall_s must be seconds or null')
    if not isinstance(row.get('seed', 0), int):
        found.append(f'{where}: seed must be a whole number')
    per_class = row.get('class_iou', {})
    if not isinstance(per_class, dict) or not all(
            isinstance(v, (int, float)) for v in per_class.values()):
        found.append(f'{where}: class_iou must map class names to numbers')
    if row.get('scope', run.get('code', {}).get('scope')) != 'whole-model':
        found.append(f'{where}: a demo measures the whole model: its scope '
                     "is 'whole-model'")
    return found


def results_file(machine: dict) -> str:
    """The results file (name without .json) of a machine described as
    the benchmark describes it (``gpu``; else ``cpu`` and
    ``cpu_features``): ``gpu-h200``, ``cpu-intel-xeon-amx``, ..."""
    def words(name):
        name = re.sub(r'\((R|TM)\)|\b(NVIDIA|Processor|CPU)\b', '', name)
        return '-'.join(re.findall(r'[a-z0-9]+', name.lower()))
    if machine.get('gpu'):
        return 'gpu-' + words(machine['gpu'])
    features = set(machine.get('cpu_features', ()))
    kind = ('amx' if 'amx_bf16' in features else
            'avx512' if 'avx512f' in features else 'avx2')
    return f"cpu-{words(machine.get('cpu', 'unknown'))}-{kind}"


def dumps(doc) -> str:
    """A results file's text: a container on one line where it fits in
    79 columns, else one item per line (diffs show the rows changed)."""
    return _format(doc, 0, 0) + '\n'


def _format(value, indent: int, start: int) -> str:
    """``value`` at ``indent``, its first line starting at column
    ``start``."""
    compact = json.dumps(value, ensure_ascii=False)
    if not isinstance(value, (dict, list)) or not value or \
            start + len(compact) <= 79:
        return compact
    pad = ' ' * (indent + 1)
    if isinstance(value, dict):
        items = [f'{pad}{json.dumps(k)}: ' + _format(
            v, indent + 1, indent + len(json.dumps(k)) + 3)
            for k, v in value.items()]
        return '{\n' + ',\n'.join(items) + '\n' + ' ' * indent + '}'
    items = [pad + _format(v, indent + 1, indent + 1) for v in value]
    return '[\n' + ',\n'.join(items) + '\n' + ' ' * indent + ']'


def add_run(run: dict, machine: dict, directory=RESULTS) -> Path:
    """Append ``run`` to its machine's results file (made if new)."""
    path = Path(directory) / f'{results_file(machine)}.json'
    doc = json.loads(path.read_text()) if path.exists() else dict(
        machine=machine, runs=[])
    doc['runs'].append(run)
    path.write_text(dumps(doc))
    return path
