"""``results.md``: every row of a run, the ratios of every variant to its
baseline measured in the same run, and the scaling with the input's
size."""
from .machine import CPU_FEATURES
from .matmul import matmul_summary
from .names import RUNTIMES


def _head(*columns):
    """A markdown table's header row and its separator."""
    return ['| ' + ' | '.join(columns) + ' |',
            '|' + ' --- |' * len(columns)]


def _fmt(value, spec):
    return '' if value is None else format(value, spec)


def _num(value, spec):
    """``value`` as ``spec`` (fixed point) where that keeps two significant
    digits or more, else with three (a tiny model's 0.0760 GMAC and 0.0342 s
    first call, not 0.1 and 0.0)."""
    if value is None:
        return ''
    fixed = format(value, spec)
    if value == 0 or sum(c.isdigit() for c in fixed.lstrip('-0.')) >= 2:
        return fixed
    return format(value, '#.3g')


def _speedup(r):
    """A ratio row's speed-up, and each round's where there were several
    (the round with the median time of each row gives the speed-up)."""
    rounds = r.get('round_speedups') or []
    return f'{r["speedup"]:.2f}x' + (
        f' (rounds: {", ".join(f"{x:.2f}" for x in rounds)})'
        if len(rounds) > 1 else '')


# the variants that change the precision a row computes in
PRECISIONS = frozenset({'amp', 'bf16'})


def ratio_rows(results, against: str = 'reference'):
    """Speed-up and memory ratios at the same size, batch and mode (and
    the speed-up of each round, ``round_speedups``, where both rows have
    their rounds' times: round i of the baseline over round i): each
    variant against its ``@reference`` (``against='reference'``; the
    reference with the same precision variant, ``@reference+amp`` for
    ``@amp`` and ``@reference+bf16`` for ``@bf16``, where it was measured,
    else the fp32 one; a whole iteration, ``@iter``, against an iteration),
    each row of an XCiT against the published backbone
    (``'published'``: ``@published``, ``@published+amp`` likewise), or
    each runtime row against the eager PyTorch row of its model
    (``'eager'``). Each names its ``baseline`` row's model."""
    def parts(r):
        base, _, suffix = r['model'].partition('@')
        return base, set(filter(None, suffix.split('+')))

    def key(r, precision):
        return (parts(r)[0], precision, r['h'], r['w'], r['batch'],
                r['mode'])

    def is_baseline(r):
        return against in parts(r)[1] if against != 'eager' \
            else not parts(r)[1]

    def compared(r):
        if against == 'eager':
            return parts(r)[1] & set(RUNTIMES)
        # the published backbone is XCiT's: not the detectors' baseline
        return against == 'reference' or parts(r)[0].startswith('xcit_')

    def kind(r):  # its precision, and whether it is a whole iteration
        return frozenset(parts(r)[1] & (PRECISIONS | {'iter'}))

    refs = {key(r, kind(r)): r for r in results
            if 'error' not in r and is_baseline(r)}
    rows = []
    for r in results:
        ref = refs.get(key(r, kind(r))) or \
            refs.get(key(r, kind(r) - PRECISIONS))
        if ref is None or r is ref or 'error' in r or not compared(r) or \
                is_baseline(r):
            continue
        rows.append(dict(
            model=r['model'], baseline=ref['model'],
            size=f'{r["h"]}x{r["w"]}', batch=r['batch'],
            mode=r['mode'], speedup=ref['seconds'] / r['seconds'],
            round_speedups=[a / b for a, b in zip(
                ref.get('round_seconds', []), r.get('round_seconds', []))
                if a is not None and b is not None],
            peak_mem_ratio=r['peak_mem_gib'] / ref['peak_mem_gib'],
            activation_mem_ratio=(r['activation_mem_gib'] /
                                  ref['activation_mem_gib']),
            diff=r.get('max_rel_diff_vs_reference'),
            export_s=r.get('export_s')))
    return rows


def scaling_rows(results, small=(800, 1344), large=(1600, 2688)):
    """(model, batch, mode, time at ``large`` over time at ``small``)."""
    times = {}
    for r in results:
        if 'error' not in r:
            times[(r['model'], r['batch'], r['mode'], r['h'], r['w'])] = \
                r['seconds']
    rows = []
    for (model, batch, mode, h, w), t in times.items():
        if (h, w) == large and (model, batch, mode, *small) in times:
            rows.append((model, batch, mode,
                         t / times[(model, batch, mode, *small)]))
    return rows


def write_table(results, matmul, args, path, found=None):
    """``results.md``: every row, then the ratios to the baselines measured
    in the same run and the scaling from 800x1344 to 1600x2688; ``found``:
    :func:`machine`'s description, named in the first line."""
    lines = _main_table(results, matmul, args, found or {})
    lines += _reference_ratios(results) + _published_ratios(results) + \
        _runtime_ratios(results) + _scaling(results)
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')


def _where(found):
    """`` (GPU, PyTorch ...; host CPU ...)``: the machine in words."""
    parts = [found['gpu']] if 'gpu' in found else []
    if 'cpu' in found:
        features = ', '.join(found.get('cpu_features', ())) or 'none of ' \
            + '/'.join(CPU_FEATURES)
        parts.append(('host ' if 'gpu' in found else '') +
                     f'{found["cpu"]} ({features})')
    if 'torch' in found:
        parts.append(f'PyTorch {found["torch"]}')
    return f' ({"; ".join(parts)})' if parts else ''


def _memory_note(args) -> str:
    """What the memory columns measured."""
    if args.device != 'cpu':
        return ("torch.cuda.max_memory_allocated plus CUDA graph pools' "
                'idle memory; "act." = that minus the memory allocated '
                'before the first step.')
    where = ("the tool's process during the steps, every measurement in it "
             '(--in-process)' if getattr(args, 'in_process', False) else
             'a fresh process per measurement')
    return (f'peak resident set of {where} (model and libraries included); '
            '"act." = that peak minus the resident set before the first '
            'step.')


def _main_table(results, matmul, args, found):
    lines = [
        f'{args.threads} threads, device {args.device}{_where(found)}; '
        'median of '
        f'{args.repeat} runs after {args.warmup} warm-up'
        + (f', median over {args.rounds} interleaved rounds' if
           args.rounds > 1 else '') + '; fp32 unless '
        f'"@bf16" / "@amp"; machine matmul ({args.matmul_size}^2): '
        f'{matmul_summary(matmul)}. Memory: {_memory_note(args)} '
        "GMAC/image: the forward's (inference) or the whole training "
        "step's, forward and backward (train).", '',
        *_head('model', 'input', 'batch', 'mode', 'time (s)', 'images/s',
               'first call (s)', 'peak mem (GiB)', 'act. mem (GiB)',
               'GMAC/image', 'executed GMAC/image', 'achieved GFLOP/s')]
    for r in results:
        size = f'{r["h"]}x{r["w"]}'
        head = f'| {r["model"]} | {size} | {r["batch"]} | {r["mode"]} | '
        if 'error' in r:
            lines.append(head + f'{r["error"]} | | | | | | | |')
            continue
        gmac = r.get('gmac_per_image')
        lines.append(
            head + f'{_num(r["seconds"], ".3f")} | '
            f'{_num(r["images_per_s"], ".2f")} | '
            f'{_num(r["first_call_s"], ".1f")} | '
            f'{_num(r["peak_mem_gib"], ".2f")} | '
            f'{_num(r["activation_mem_gib"], ".2f")} | '
            f'{_num(gmac, ".1f")} | '
            f'{_num(r.get("executed_gmac_per_image", gmac), ".1f")} | '
            f'{_num(r.get("achieved_gflops_per_s"), ".0f")} |')
    return lines


def _reference_ratios(results):
    return _ratio_table(
        ratio_rows(results), 'Against the straightforward computation '
        '(`@reference`, with the same precision variant where one was '
        'measured), same run:', with_diff=True)


def _published_ratios(results):
    return _ratio_table(
        ratio_rows(results, against='published'), 'Against the published '
        'backbone (`@published`: facebookresearch/xcit\'s code, with the '
        'same precision variant where one was measured), same run:',
        with_diff=False)


def _ratio_table(rows, title: str, with_diff: bool):
    """Lines of a table of :func:`ratio_rows` (none if there are none),
    with the output difference column where ``with_diff``."""
    if not rows:
        return []
    lines = ['', title, '',
             *_head('model', 'input', 'batch', 'mode', 'speed-up',
                    'peak mem ratio', 'act. mem ratio',
                    *(['max output diff (rel. to max)'] if with_diff
                      else []))]
    for r in rows:
        cells = [r['model'], r['size'], r['batch'], r['mode'],
                 _speedup(r), f'{r["peak_mem_ratio"]:.2f}',
                 f'{r["activation_mem_ratio"]:.2f}']
        if with_diff:
            cells.append(_fmt(r['diff'], '.1e'))
        lines.append('| ' + ' | '.join(map(str, cells)) + ' |')
    return lines


def _runtime_ratios(results):
    rows = ratio_rows(results, against='eager')
    if not rows:
        return []
    lines = [
        '', 'Runtimes against our eager PyTorch path (fast path on), '
        'same run (> 1: the runtime is faster):', '',
        *_head('model', 'input', 'batch', 'speed-up over eager',
               'peak mem ratio', 'max output diff (rel. to max)',
               'export + verification (s)')]
    for r in rows:
        lines.append(
            f'| {r["model"]} | {r["size"]} | {r["batch"]} | '
            f'{_speedup(r)} | {r["peak_mem_ratio"]:.2f} | '
            f'{_fmt(r["diff"], ".1e")} | {_fmt(r["export_s"], ".0f")} |')
    return lines


def _scaling(results):
    scaling = scaling_rows(results)
    if not scaling:
        return []
    return ['', 'Time at 1600x2688 over time at 800x1344 (4.0 is '
            'linear in pixels):', '',
            *_head('model', 'batch', 'mode', 'ratio')] + [
        f'| {m} | {b} | {mode} | {t:.2f} |' for m, b, mode, t in scaling]
