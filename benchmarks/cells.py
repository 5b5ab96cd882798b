"""How the tables write a row's figures: times, memory, ratios with their
baselines named, a demo's metrics, and the mark of a row older than the
code."""
from decimal import ROUND_HALF_UP, Decimal

from . import targets as tg

STALE = '†'
STALE_NOTE = (f'{STALE} measured before a later change to the code it '
              'measures.')

MODELS = {
    'xcit_small_12_p16': 'XCiT-S12/16', 'xcit_small_12_p8': 'XCiT-S12/8',
    'swin_t': 'Swin-T (mmdet)', 'r50': 'ResNet-50 (mmdet)',
    'vit_s16': 'ViT-S/16, global attention (timm)',
    'vit_b16': 'ViT-B/16, global attention (timm)',
    'mask_rcnn_xcit_s12': 'Mask R-CNN XCiT-S12/16',
    'mask_rcnn_swin_t': 'Mask R-CNN Swin-T (mmdet)',
    'upernet_xcit_s12': 'UperNet XCiT-S12/16',
    'mask_rcnn_xcit_n12': 'Mask R-CNN XCiT-N12/16',
    'upernet_xcit_n12': 'UperNet XCiT-N12/16',
}
#: a variant as a ratio's baseline
BASELINES = {'published': 'the published code',
             'straightforward': 'the straightforward computation'}
#: a variant in a row's description
VARIANTS = {'published': 'the published code',
            'straightforward': 'straightforward',
            'default': 'default', 'default+graphs': 'default, CUDA graphs',
            'default+compile': 'default, compile_cfg=True',
            'default+with_cp': 'default, with_cp=True', 'peer': None}


def model(name: str) -> str:
    return MODELS.get(name, name)


def described(row) -> str:
    """``XCiT-S12/16, default, CUDA graphs, fp16 autocast``."""
    if row['mode'] == 'tests':
        return f"`{row['name']}`"
    if row['mode'] == 'demo':  # the config as it is
        return f"{model(row['model'])}, {row['precision']}, seed " \
            f"{row['seed']}"
    variant = VARIANTS.get(row['variant'], row['variant'])
    parts = [model(row['model']), variant, row['precision']]
    return ', '.join(p for p in parts if p)


def baseline_name(row, ratio: dict) -> str:
    base = row.baseline(ratio)
    if base['variant'] in BASELINES:
        return BASELINES[base['variant']]
    if base['variant'] == 'peer' or base['model'] != row['model']:
        return model(base['model'])
    return base['variant']


def seconds(value, machine: str, plain=False) -> str:
    """A time as the machine's tables give it: ms on a GPU, s on a CPU
    (``plain``: no trailing zeros, for a target)."""
    unit, value = ('ms', value * 1000) if machine.startswith('gpu-') else \
        ('s', value)
    if plain:
        return f'{value:g} {unit}'
    if unit == 'ms':
        return f'{value:.1f} ms' if value >= 10 else f'{value:.2f} ms'
    return f'{value:.3f} s' if value < 10 else f'{value:.2f} s'


def gib(value) -> str:
    return f'{value:.2f} GiB'


def ratio(row, ratio: dict, rounds=False, memory=True) -> str:
    """``1.88x the published code (rounds 2.10, 1.87, 1.64; 0.86 of its
    peak memory)``: the rounds only if asked, the memory unless not."""
    text = ''
    if 'speedup' in ratio:
        text = f"{ratio['speedup']:.2f}x {baseline_name(row, ratio)}"
    more = []
    if rounds and ratio.get('rounds'):
        more.append('rounds ' + ', '.join(f'{r:.2f}'
                                          for r in ratio['rounds']))
    for key, what in (('peak_mem', 'peak'), ('activation_mem', 'activation')):
        if memory and key in ratio:
            more.append(f'{ratio[key]:.2f} of its {what} memory')
    if not text:
        return f"{'; '.join(more)} of {baseline_name(row, ratio)}"
    return text + (f" ({'; '.join(more)})" if more else '')


#: a demo's metrics as the tables name them, and their decimals
METRICS = {'bbox_mAP': ('bbox mAP', 3), 'bbox_mAP_50': ('bbox mAP@50', 3),
           'segm_mAP': ('segm mAP', 3), 'segm_mAP_50': ('segm mAP@50', 3),
           'aAcc': ('aAcc', 2), 'mIoU': ('mIoU', 2), 'mAcc': ('mAcc', 2)}


def metric(name: str, value) -> str:
    """``value`` of metric ``name`` to its decimals, halves rounded up
    (the median of two seeds' figures)."""
    places = Decimal(1).scaleb(-METRICS[name][1])
    return str(Decimal(str(value)).quantize(places, ROUND_HALF_UP))


def duration(seconds) -> str:
    """``148 s``, ``10 min 38 s``; '' where not recorded."""
    if seconds is None:
        return ''
    minutes, rest = divmod(round(seconds), 60)
    return f'{minutes} min {rest} s' if minutes else f'{rest} s'


def demo(row) -> str:
    """``bbox mAP 0.309, ..., segm mAP@50 0.525 in 10 min 38 s``."""
    text = ', '.join(f'{METRICS[k][0]} {metric(k, v)}'
                     for k, v in row['metrics'].items())
    took = duration(row['wall_s'])
    return f'{text} in {took}' if took else text


def tests(row) -> str:
    text = f"{row['passed']} passed, {row['skipped']} skipped, " \
        f"{row['failed']} failed"
    if row.get('failures'):
        text += ' (' + ', '.join(f'`{f}`' for f in row['failures']) + ')'
    return text


def mark(text: str, row, stale) -> str:
    return text + STALE if stale(row) else text


def aim(aim: dict, machine: str, baseline_said=False) -> str:
    """What an aim asks, in words (``baseline_said``: the aim before named
    the same baseline, which is then left out)."""
    if 'seconds_at_most' in aim:
        return 'at most ' + seconds(aim['seconds_at_most'], machine,
                                    plain=True)
    if 'max_rel_diff_at_most' in aim:
        return (f"outputs within {sci(aim['max_rel_diff_at_most'])} of the "
                "straightforward computation's")
    if 'faster_than' in aim:
        return f"faster than {model(aim['faster_than'])}"
    if 'all_pass' in aim:
        return 'all pass'
    key = next(k for k in _RATIO_AIMS if k in aim)
    of = '' if baseline_said else ' ' + BASELINES[aim[key]]
    if key == 'speedup_over':
        return f"{aim['at_least']:g}x{of}"
    what = 'peak' if key == 'peak_mem_over' else 'activation'
    if aim['at_most'] == 1:
        return f'no more {what} memory' + (f' than{of}' if of else '')
    return f"at most {aim['at_most']:g} of {'its' if not of else 'the'} " \
        f"{what} memory{' of' + of if of else ''}"


_RATIO_AIMS = {'speedup_over': 'speedup', 'peak_mem_over': 'peak_mem',
               'activation_mem_over': 'activation_mem'}


def aimed(target: dict, machine: str) -> str:
    said, texts = None, []
    for a in target['aim']:
        baseline = next((a[k] for k in _RATIO_AIMS if k in a), None)
        texts.append(aim(a, machine, baseline is not None
                         and baseline == said))
        said = baseline
    return ', '.join(texts) or '-'


def sci(value: float) -> str:
    """``1.1e-6``, ``1e-4``."""
    mantissa, exponent = f'{value:.1e}'.split('e')
    return f"{mantissa.removesuffix('.0')}e{int(exponent)}"


def measured(target: dict, row, stale) -> str:
    """What ``row`` measured of ``target``: its time on a GPU or where an
    aim is a time, the figures its aims concern, its ratios to the
    baselines of ``also``; marked if the row is stale; then what an aim
    needs and the row does not measure."""
    if row['mode'] == 'tests':
        return mark(tests(row), row, stale)
    parts, missing, shown = [], [], []
    if row.machine.startswith('gpu-') or any(
            'seconds_at_most' in a for a in target['aim']):
        if 'seconds' in row.data:
            parts.append(seconds(row['seconds'], row.machine))
    for a in target['aim']:
        _aim_figure(a, row, parts, missing, shown)
    for variant in target.get('also', []):
        found = tg.ratio_to(row, variant)
        if found and found['baseline'] not in shown:
            shown.append(found['baseline'])
            parts.append(ratio(row, found, memory=False))
    if parts:
        parts[0] = mark(parts[0], row, stale)
    return ', '.join(parts + list(dict.fromkeys(missing)))


def _aim_figure(a: dict, row, parts: list, missing: list, shown: list):
    if 'max_rel_diff_at_most' in a:
        diff = row.get('max_rel_diff_vs_reference')
        if diff is None:
            missing.append('output difference not measured')
        else:
            parts.append(f'outputs within {sci(diff)}')
    elif 'faster_than' in a:
        peer = tg.peer_row(row, a['faster_than'])
        if peer is None or 'seconds' not in peer:
            missing.append(f"{model(a['faster_than'])} not measured "
                           'beside it')
        else:
            parts.append(f"{model(peer['model'])} "
                         f"{seconds(peer['seconds'], row.machine)}")
    key = next((k for k in _RATIO_AIMS if k in a), None)
    if key is None:
        return
    found = tg.ratio_to(row, a[key])
    if found is None or _RATIO_AIMS[key] not in found:
        missing.append(f'not measured against {BASELINES[a[key]]}'
                       if found is None else
                       f'{_FIGURES[_RATIO_AIMS[key]]} against '
                       f'{BASELINES[a[key]]} not measured')
    elif found['baseline'] not in shown:
        shown.append(found['baseline'])
        parts.append(ratio(row, found, memory=key != 'speedup_over'))
    elif key != 'speedup_over':  # its memory beside the time shown
        parts[-1] = ratio(row, found, memory=True)


_FIGURES = dict(speedup='time', peak_mem='peak memory',
                activation_mem='activation memory')
