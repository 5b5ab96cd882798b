"""The README's GPU table from ``make gpu-report``'s rows.

Reads ``tools/benchmark.py``'s ``results.json`` in each step's folder of the
report (``backbone/``, ``backbone_train/``, ``backbone_graphs/``,
``backbone_graphs_train/``, ``backbone_compiled/``, ``heads/``,
``heads_ade20k/``) and prints a
markdown table per step: every measured row with its time, its speed-up
and peak memory against the straightforward computation of the same
precision in the same run (``@reference`` / ``@reference+amp``), against
the published backbone where the run measured it (``@published`` /
``@published+amp``), and the achieved TFLOP/s beside the GPU's measured
matmul rate; beside the time, where the row has it, its host part (until
the step returned to the CPU, before the wait for the GPU); above it, the
GPU, PyTorch, CUDA and the command. Rows that failed show their error. After
them, from ``tile_sweep.jsonl`` (``STEP=tiles``), the Triton kernels'
default tiles against the fastest candidate, per part and dtype. Run::

    python -m benchmarks.gpu.table work_dirs/gpu_report \
        --out work_dirs/gpu_report/table.md

(``make gpu-report STEP=table``): the table is printed and, with ``--out``,
written to that file, moved into place once it is complete; a report
without rows writes nothing.
"""
import argparse
import json
import os.path as osp

from benchmarks.harness.names import parse_model
from benchmarks.harness.report import ratio_rows
from xcit_dense.atomic_files import (
    move_into_place,
    unverified_file,
)

STEPS = ('backbone', 'backbone_train', 'backbone_graphs',
         'backbone_graphs_train',
         'backbone_compiled', 'heads', 'heads_ade20k')


def load(report: str):
    """The step folders' ``results.json`` that exist, by step."""
    found = {}
    for step in STEPS:
        path = osp.join(report, step, 'results.json')
        if osp.isfile(path):
            with open(path) as f:
                found[step] = json.load(f)
    return found


def _tflops(r) -> str:
    rate = r.get('achieved_gflops_per_s')
    return '' if rate is None else f'{rate / 1e3:.1f}'


def _ran_otherwise(r) -> str:
    """What a row did instead of what its name asks for (the benchmark
    records a failed compilation, the CUDA graphs' captures and the Triton
    kernels that failed)."""
    _, variants = parse_model(r['model'])
    notes = [f'{kernels}: straightforward, {verdict}'
             for kernels, verdict in r.get('triton_kernels', {}).items()
             if verdict != 'ran']
    if r.get('compile_failure'):
        notes.append(f'eager, compilation failed: {r["compile_failure"]}')
    for name in ('graphs', 'training_graphs'):
        if r.get(f'{name}_failure'):
            notes.append(f'eager, CUDA graphs stopped: {r[name + "_failure"]}')
    if 'graphs' in variants and not r.get('graphs_captures') and \
            not r.get('training_graphs_captures'):
        notes.append('eager, no CUDA graph captured')
    return '; '.join(n[:100] for n in notes)


#: the tests' tolerances of the kernels against fp32 (tests/test_cuda.py)
TOLERANCE = {'float32': 1e-4, 'float16': 4e-3, 'bfloat16': 3e-2}


def tile_table(report: str) -> list:
    """Lines of the tile sweep's table: per part and dtype, the default's
    time and the fastest candidate's, with its constants."""
    path = osp.join(report, 'tile_sweep.jsonl')
    if not osp.isfile(path):
        return []
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    tolerances = ', '.join(f'{dtype} {tol:g}'
                           for dtype, tol in TOLERANCE.items())
    lines = ['**tiles**: `python -m benchmarks.gpu.tile_sweep` (forward '
             'and backward, ms; the fastest among the candidates within the '
             f"tests' tolerance of the default's results: {tolerances})", '',
             '| part | dtype | default (ms) | fastest (ms) | its constants |'
             ' failed |', '|' + ' --- |' * 6]
    for key in dict.fromkeys((r['part'], r['dtype']) for r in rows):
        group = [r for r in rows if (r['part'], r['dtype']) == key]
        default = next((r for r in group if r['default']), {})
        ok = [r for r in group if 'ms' in r and
              r.get('max_rel_diff_vs_default', 1) <= TOLERANCE[r['dtype']]]
        best = min(ok, key=lambda r: r['ms']) if ok else {}
        failed = sum('error' in r for r in group)
        cells = [*key, f'{default["ms"]:.3f}' if 'ms' in default
                 else 'failed',
                 f'{best["ms"]:.3f}' if best else '',
                 f'`{json.dumps(best["constants"])}`' if best else '',
                 str(failed)]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return lines + ['']


def _by_row(ratios) -> dict:
    """:func:`ratio_rows`'s rows by (model, size, batch, mode)."""
    return {(r['model'], r['size'], r['batch'], r['mode']): r
            for r in ratios}


def table(report: str) -> str:
    runs = load(report)
    tiles = tile_table(report)
    if not runs and not tiles:
        raise SystemExit(f'{report}: no results.json under '
                         f'{", ".join(STEPS)} and no tile_sweep.jsonl (run '
                         'make gpu-report first)')
    lines = []
    for step, run in runs.items():
        machine = run.get('machine', {})
        matmul = run['matmul']
        published = _by_row(ratio_rows(run['results'], 'published'))
        lines += [
            f'**{step}**: {machine.get("gpu", run["device"])}, PyTorch '
            f'{machine.get("torch", "?")}, CUDA {machine.get("cuda", "?")}; '
            f'matmul fp32 {matmul["fp32_gflops_per_s"] / 1e3:.1f} TFLOP/s, '
            f'bf16 {matmul["bf16_gflops_per_s"] / 1e3:.1f} TFLOP/s; '
            f'`python tools/benchmark.py {" ".join(run["argv"])}`', '',
            '| model | input | batch | mode | time (ms) | vs straightforward '
            + ('| vs published ' if published else '') +
            '| peak mem (GiB) | mem vs straightforward | achieved TFLOP/s |',
            '|' + ' --- |' * (10 if published else 9)]
        ratios = _by_row(ratio_rows(run['results']))
        for r in run['results']:
            size = f'{r["h"]}x{r["w"]}'
            head = f'| {r["model"]} | {size} | {r["batch"]} | {r["mode"]} |'
            if 'error' in r:
                lines.append(f'{head} failed: {r["error"][:80]} | | | | |'
                             + (' |' if published else ''))
                continue
            ratio = ratios.get((r['model'], size, r['batch'], r['mode']))
            versus = published.get((r['model'], size, r['batch'],
                                    r['mode']))
            otherwise = _ran_otherwise(r)
            if otherwise:
                head = f'| {r["model"]} ({otherwise}) | {size} | ' \
                    f'{r["batch"]} | {r["mode"]} |'
            host = r.get('host_seconds')
            lines.append(
                f'{head} {1e3 * r["seconds"]:.1f}'
                + (f' (host {1e3 * host:.1f})' if host is not None else '')
                + ' | '
                + (f'{ratio["speedup"]:.2f}x' if ratio else '') + ' | '
                + ((f'{versus["speedup"]:.2f}x' if versus else '') + ' | '
                   if published else '') +
                f'{r["peak_mem_gib"]:.2f} | '
                + (f'{ratio["peak_mem_ratio"]:.2f}' if ratio else '') + ' | '
                f'{_tflops(r)} |')
        lines.append('')
    return '\n'.join(lines + tiles)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('report', help="make gpu-report's folder "
                        '(GPU_REPORT)')
    parser.add_argument('--out', metavar='FILE',
                        help='also write the table to FILE (nothing is '
                        'written where the report has no rows)')
    args = parser.parse_args(argv)
    text = table(args.report)
    if args.out:
        with unverified_file(args.out, '.md') as partial:
            with open(partial, 'w') as f:
                f.write(text + '\n')
            move_into_place(partial, args.out)
    print(text)


if __name__ == '__main__':
    main()
