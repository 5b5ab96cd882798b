"""The fingerprint of the code a measurement measures, so that a results
row can say whether the code has changed since it was measured.

A fingerprint hashes the syntax trees of a scope's Python files (their
paths relative to the repository and their code), without docstrings,
other bare string statements, comments, formatting or line numbers: a
change to what the code does changes it, an edit of its prose does not.
It is computed from the source alone (no git history), the same on every
machine and on Python 3.9 and later (fields a Python version leaves empty
are not hashed).

Scopes (:data:`SCOPES`): ``backbone`` for the backbone's rows,
``whole-model`` for detectors', segmentors' and the optimizer's (the
package as it runs in training and inference, and the configs),
``cuda-tests`` for a run of ``tests/test_cuda.py``. A scope lists paths
and the paths under them it leaves out; extend it when the code it
measures moves.

``python -m benchmarks.fingerprint [--commit C] [SCOPE ...]`` prints the
fingerprints of the working tree, or of a commit's tree (read with
``git show``, for a row measured at a known commit).
"""
import argparse
import ast
import functools
import hashlib
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: scope -> (paths it covers, paths under them it leaves out)
SCOPES = {
    'backbone': (('xcit_dense/models',), ()),
    'whole-model': (('xcit_dense', 'configs'),
                    ('xcit_dense/deploy', 'xcit_dense/.mim')),
    # the CUDA tests run the benchmark's harness and probes too
    'cuda-tests': (('xcit_dense', 'configs', 'tools', 'benchmarks/harness',
                    'benchmarks/gpu', 'benchmarks/probes',
                    'tests/test_cuda.py', 'tests/conftest.py',
                    'tests/tool_runs.py'),
                   ('xcit_dense/.mim',)),
}

#: what a row measured before fingerprints were recorded carries
UNKNOWN = 'unknown'


def code_fingerprint(scope: str, root=REPO) -> str:
    """The fingerprint of ``scope`` in the tree at ``root`` (16 hex
    digits); what the benchmark writes into each new row."""
    root = Path(root)
    paths = [p.relative_to(root).as_posix() for p in _python_files(
        scope, root)]
    return fingerprint_of({p: (root / p).read_text() for p in paths})


def fingerprint_of(sources: dict) -> str:
    """The fingerprint of ``{relative path: source}``."""
    digest = hashlib.sha256()
    for path in sorted(sources):
        digest.update(path.encode() + b'\0')
        digest.update(code_of(sources[path]).encode() + b'\0')
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def code_of(source: str) -> str:
    """``source``'s syntax tree without its string statements, written
    out field by field (empty fields omitted)."""
    return _dump(_WithoutStrings().visit(ast.parse(source)))


class _WithoutStrings(ast.NodeTransformer):
    """Drops statements that are a bare string (docstrings among them)."""

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Constant) and isinstance(
                node.value.value, str):
            return None
        return self.generic_visit(node)


def _dump(node) -> str:
    if isinstance(node, ast.AST):
        fields = ','.join(f'{name}={_dump(value)}'
                          for name, value in ast.iter_fields(node)
                          if value is not None and value != [])
        return f'{type(node).__name__}({fields})'
    if isinstance(node, list):
        return '[' + ','.join(_dump(item) for item in node) + ']'
    return repr(node)


def _in_scope(scope: str, relative: str) -> bool:
    if scope not in SCOPES:
        raise KeyError(f'unknown code scope {scope!r}; the scopes are '
                       f'{", ".join(SCOPES)}')
    covered, left_out = SCOPES[scope]

    def under(paths):
        return any(relative == p or relative.startswith(p + '/')
                   for p in paths)
    return relative.endswith('.py') and under(covered) and not under(
        left_out)


def _python_files(scope: str, root: Path):
    covered, _ = SCOPES[scope]
    for top in covered:
        path = root / top
        found = [path] if path.is_file() else sorted(path.rglob('*.py'))
        for file in found:
            if _in_scope(scope, file.relative_to(root).as_posix()):
                yield file


def fingerprint_at(scope: str, commit: str, root=REPO) -> str:
    """The fingerprint of ``scope`` in ``commit``'s tree, read from git."""
    def git(*args):
        return subprocess.run(['git', '-C', str(root), *args], check=True,
                              capture_output=True, text=True).stdout
    names = git('ls-tree', '-r', '--name-only', commit, '--',
                *SCOPES[scope][0]).split('\n')
    return fingerprint_of({n: git('show', f'{commit}:{n}') for n in names
                           if n and _in_scope(scope, n)})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('scopes', nargs='*', default=list(SCOPES))
    parser.add_argument('--commit', help="a commit's tree instead of the "
                        'working tree')
    args = parser.parse_args(argv)
    for scope in args.scopes:
        print(scope, fingerprint_at(scope, args.commit) if args.commit
              else code_fingerprint(scope))


if __name__ == '__main__':
    main()
