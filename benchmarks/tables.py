"""The tables of README.md and docs/*.md, generated from the results files.

A generated table sits between two markers in the markdown::

    <!-- table: NAME -->
    ...
    <!-- /table -->

``python -m benchmarks.tables`` rewrites what lies between them from
``benchmarks/results/``; ``--check`` rewrites nothing and fails, naming
each table, where a document differs from what the results give, where a
marker names no table, or where a results file lacks a field;
``--show NAME`` prints one table. The names: :func:`names`.
"""
import argparse
import functools
import re
import sys
from pathlib import Path

from . import demo_tables, export_tables
from . import results as res
from . import table_kinds as kinds
from . import targets as tg

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = ('README.md', 'docs/*.md')
MARKED = re.compile(r'(<!-- table: (?P<name>[^>]*?) -->\n)(?P<body>.*?)'
                    r'(<!-- /table -->)', re.S)

#: name -> function of the results writing that table
TABLES = {
    'cpu': kinds.cpu,
    'gpu': kinds.gpu,
    'targets': kinds.targets,
    'cpu-published': kinds.cpu_published,
    'cpu-scaling': kinds.cpu_scaling,
    'machines': kinds.machines,
    'export-cpu': export_tables.export_cpu,
    'optimizer-step': kinds.optimizer_step,
    **demo_tables.TABLES,
}
#: and ``rows-<results file>`` for each results file: every row of it
ROWS = 'rows-'


def load(directory=res.RESULTS, stale=res.is_stale) -> kinds.Results:
    docs = res.load(directory)
    return kinds.Results(docs, res.rows(docs), res.load_targets(directory),
                         stale)


def names(results: kinds.Results) -> list:
    """Every table a marker may name."""
    return list(TABLES) + [ROWS + machine for machine in results.docs]


def table(name: str, results: kinds.Results) -> str:
    """The markdown of table ``name``."""
    if name in TABLES:
        return TABLES[name](results)
    if name.startswith(ROWS) and name[len(ROWS):] in results.docs:
        return kinds.rows_of(results, name[len(ROWS):])
    raise KeyError(f'no table is named {name!r}; the tables: '
                   f'{", ".join(names(results))}')


def regenerate(text: str, results: kinds.Results, where='') -> tuple:
    """``text`` with every marked table regenerated, and the problems:
    markers naming no table."""
    problems = []
    made = functools.lru_cache(maxsize=None)(
        lambda name: table(name, results))

    def replace(match):
        name = match['name'].strip()
        try:
            body = made(name) + '\n'
        except KeyError as error:
            problems.append(f'{where}: {error.args[0]}')
            return match[0]
        return match[1] + body + match[4]
    return MARKED.sub(replace, text), problems


def documents(root=REPO) -> list:
    return [p for pattern in DOCUMENTS for p in sorted(Path(root).glob(
        pattern))]


def run(check: bool, root=REPO, results=None) -> list:
    """Regenerate (or with ``check`` only compare) every document's
    tables; the problems found, one line each."""
    results = results or load()
    problems = res.problems(results.docs) + tg.problems(results.targets,
                                                        results.docs)
    for path in documents(root):
        text = path.read_text()
        new, found = regenerate(text, results, path.relative_to(root))
        problems += found
        if new == text:
            continue
        if check:
            problems += [f'{path.relative_to(root)}: table {name!r} '
                         'differs from the results (python -m '
                         'benchmarks.tables rewrites it)'
                         for name in _changed(text, new)]
        else:
            path.write_text(new)
    return problems


def _changed(old: str, new: str) -> list:
    before = {m['name'].strip(): m['body'] for m in MARKED.finditer(old)}
    return [m['name'].strip() for m in MARKED.finditer(new)
            if before.get(m['name'].strip()) != m['body']]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog='python -m benchmarks.tables',
        description=__doc__.split('\n\n')[0])
    parser.add_argument('--check', action='store_true',
                        help='compare only; fail where a table differs')
    parser.add_argument('--show', metavar='NAME',
                        help='print one table (see --list)')
    parser.add_argument('--list', action='store_true',
                        help='the names of the tables')
    args = parser.parse_args(argv)
    results = load()
    if args.list:
        print('\n'.join(names(results)))
        return 0
    if args.show:
        try:
            print(table(args.show, results))
        except KeyError as error:
            print(error.args[0], file=sys.stderr)
            return 2
        return 0
    problems = run(args.check, results=results)
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
