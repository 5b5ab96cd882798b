"""A benchmark run as rows of the results files (``benchmarks/results/``,
schema in its README): each row with the fingerprint of the code it
measured, so that the docs' tables can tell a row measured before a later
change to that code.

A row of an XCiT backbone or a peer backbone measures the ``backbone``
scope, a detector's or segmentor's the ``whole-model`` scope; the published
code and peers are no code of ours (scope null). ``--record`` appends one
results run per scope measured (:func:`record_runs`).
"""
import datetime
import os
import platform
import shlex
import subprocess
from importlib import metadata

from benchmarks import results as res
from benchmarks.fingerprint import REPO, SCOPES, fingerprint_at

from .names import DETECTORS, PEERS, RUNTIMES, SEGMENTORS, parse_model
from .report import ratio_rows

#: distribution -> the name a results run gives its version
LIBRARIES = {'torch': 'torch', 'mmcv': 'mmcv', 'mmengine': 'mmengine',
             'mmdet': 'mmdet', 'mmsegmentation': 'mmseg', 'timm': 'timm',
             'triton': 'triton', 'onnxruntime': 'onnxruntime',
             'openvino': 'openvino'}
#: a measurement's figures a results row keeps
FIGURES = ('seconds', 'peak_mem_gib', 'activation_mem_gib',
           'peak_reserved_gib', 'first_call_s', 'gmac_per_image',
           'executed_gmac_per_image', 'achieved_gflops_per_s',
           'max_rel_diff_vs_reference', 'host_seconds', 'export_s', 'error')


def family(name: str) -> str:
    """The scope whose run holds the row of benchmark model ``name``:
    ``backbone`` for backbones, ``whole-model`` for detectors and
    segmentors."""
    base = parse_model(name)[0]
    return 'whole-model' if base in DETECTORS or base in SEGMENTORS \
        else 'backbone'


def code_scope(name: str):
    """The code scope the row of ``name`` measures; None for code not ours
    (the published backbone, peers)."""
    base, variants = parse_model(name)
    if 'published' in variants or base in PEERS or \
            base == 'mask_rcnn_swin_t':
        return None
    return family(name)


def row_code(name: str) -> dict:
    """``{'scope', 'fingerprint'}`` of the working tree's code the row of
    ``name`` measures (both None for code not ours)."""
    scope = code_scope(name)
    return dict(scope=scope, fingerprint=None if scope is None
                else res.current_fingerprint(scope))


def variant(name: str, device: str) -> str:
    """The row's variant as the results files name it."""
    base, variants = parse_model(name)
    runtime = next(iter(variants & set(RUNTIMES)), None)
    if code_scope(name) is None:
        return 'published' if 'published' in variants else 'peer'
    if runtime is not None:
        return runtime
    if 'reference' in variants:
        return 'straightforward'
    extra = [v for v in ('always', 'compile', 'cp') if v in variants]
    # a recipe's backbone replays CUDA graphs on CUDA unless @eager
    graphs = 'graphs' in variants or (
        device == 'cuda' and family(name) == 'whole-model' and
        'eager' not in variants)
    extra += ['graphs'] if graphs else []
    return '+'.join(['default'] + [
        {'cp': 'with_cp'}.get(v, v) for v in extra])


def precision(name: str, device: str) -> str:
    variants = parse_model(name)[1]
    if 'int8' in variants:
        return 'int8'
    if 'bf16' in variants or ('amp' in variants and device == 'cpu'):
        return 'bf16 autocast'
    return 'fp16 autocast' if 'amp' in variants else 'fp32'


def row_id(r: dict) -> str:
    return f"{r['model']}/{r['h']}x{r['w']}/b{r['batch']}/{r['mode']}"


def results_row(r: dict, device: str) -> dict:
    """A measured row (``results.json``'s) as a results file's row."""
    base, variants = parse_model(r['model'])
    row = dict(id=row_id(r), name=r['model'], model=base,
               variant=variant(r['model'], device),
               precision=precision(r['model'], device),
               mode='iter' if 'iter' in variants else r['mode'],
               size=f"{r['h']}x{r['w']}", batch=r['batch'])
    if code_scope(r['model']) is None:
        row['scope'] = None
    row.update({k: _significant(r[k]) for k in FIGURES
                if r.get(k) is not None})
    return row


def _significant(value):
    """A float with 6 significant digits (the timings' noise is larger)."""
    return float(f'{value:.6g}') if isinstance(value, float) else value


def ratios(results: list) -> dict:
    """Row id -> its ratios to the baselines of the same run."""
    found = {}
    for against in ('reference', 'published', 'eager'):
        for ratio in ratio_rows(results, against):
            h, w = ratio['size'].split('x')
            key = dict(h=h, w=w, batch=ratio['batch'], mode=ratio['mode'])
            entry = dict(baseline=row_id(dict(key, model=ratio['baseline'])),
                         speedup=round(ratio['speedup'], 4),
                         peak_mem=round(ratio['peak_mem_ratio'], 4),
                         activation_mem=round(ratio['activation_mem_ratio'],
                                              4))
            if len(ratio['round_speedups']) > 1:
                entry['rounds'] = [round(x, 4)
                                   for x in ratio['round_speedups']]
            found.setdefault(row_id(dict(key, model=ratio['model'])),
                             []).append(entry)
    return found


def libraries(device: str) -> dict:
    """The versions of the libraries installed (PyTorch's CUDA and Python's
    on CUDA)."""
    found = {}
    for distribution, name in LIBRARIES.items():
        try:
            found[name] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            pass
    if device == 'cuda':
        import torch
        found.update(cuda=torch.version.cuda,
                     python=platform.python_version())
    return found


def commit() -> dict:
    """``{'commit': the checkout's commit}``, None outside a git clone."""
    try:
        head = subprocess.run(['git', '-C', str(REPO), 'rev-parse', '--short',
                               'HEAD'], check=True, capture_output=True,
                              text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = None
    return dict(commit=head)


def machine_entry(found: dict) -> dict:
    """A new results file's ``machine`` from :func:`.machine.machine`'s
    description."""
    entry = dict(name=found.get('gpu') or found['cpu'], cores=os.cpu_count())
    entry.update({k: found[k] for k in ('cpu', 'cpu_features', 'gpu')
                  if k in found})
    return entry


def run_of(doc: dict, scope: str, args, when: datetime.datetime) -> dict:
    """The results run of ``doc`` (``results.json``'s) rows of ``scope``'s
    run (:func:`family`)."""
    measured = [r for r in doc['results'] if family(r['model']) == scope]
    found = ratios(measured)
    rows = []
    for r in measured:
        row = results_row(r, doc['device'])
        if row['id'] in found:
            row['ratios'] = found[row['id']]
        rows.append(row)
    run = dict(id=f'{scope}-{when:%Y-%m-%d-%H%M%S}', date=f'{when:%Y-%m-%d}',
               **commit(),
               command=shlex.join(['python', 'tools/benchmark.py',
                                   *doc['argv']]),
               threads=doc['threads'], libraries=libraries(doc['device']),
               code=dict(scope=scope,
                         fingerprint=res.current_fingerprint(scope)),
               matmul_gflops_per_s={
                   k[:4]: v and round(v, 1)
                   for k, v in doc['matmul'].items()},
               method=f'median of {args.repeat} runs after {args.warmup} '
               f'warm-up, {_processes(args)}, {args.rounds} interleaved '
               'round(s) (the round of the median time)')
    if any(r['variant'] == 'published' for r in rows):
        run['published_code'] = args.published_code
    if run['commit'] and fingerprint_at(scope, run['commit']) != \
            run['code']['fingerprint']:
        run['note'] = ('the code measured differs from the commit\'s '
                       '(changes not committed)')
    return dict(run, rows=rows)


def record_runs(doc: dict, args, directory=res.RESULTS) -> list:
    """Append ``doc``'s rows to the machine's results file in
    ``directory``, one run per scope; the paths and run ids written."""
    when = datetime.datetime.now()
    os.makedirs(directory, exist_ok=True)
    written = []
    for scope in [s for s in SCOPES if any(
            family(r['model']) == s for r in doc['results'])]:
        run = run_of(doc, scope, args, when)
        written.append((res.add_run(run, machine_entry(doc['machine']),
                                    directory), run['id']))
    return written


def _processes(args) -> str:
    """Where the rows ran, as a run's ``method`` says it."""
    if getattr(args, 'in_process', False):
        return ("every row in the tool's process (--in-process: peak memory "
                'includes earlier rows)')
    return 'one process per row'
