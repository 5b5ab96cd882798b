"""``results.png``: the backbones' inference time and peak memory against
the pixels of the input, log-log, batch 1."""
from .names import DETECTORS


def plot(results, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.4))
    series = {}
    for r in results:
        if 'error' not in r and r['mode'] == 'infer' and r['batch'] == 1 \
                and r['model'] not in DETECTORS:
            series.setdefault(r['model'], []).append(
                (r['h'] * r['w'], r['seconds'], r['peak_mem_gib']))
    for name, points in sorted(series.items()):
        points.sort()
        px = [p[0] / 1e6 for p in points]
        style = '--' if name.endswith('@reference') else '-'
        ax_t.plot(px, [p[1] for p in points], style, marker='o', label=name)
        ax_m.plot(px, [p[2] for p in points], style, marker='o', label=name)
    if series:
        lo = min(p[0] for s in series.values() for p in s) / 1e6
        hi = max(p[0] for s in series.values() for p in s) / 1e6
        ref = min(s[0][1] for s in series.values())
        ax_t.plot([lo, hi], [ref, ref * hi / lo], ':', color='grey',
                  label='linear in pixels')
        ax_t.legend(fontsize=7)
    from matplotlib.ticker import NullFormatter
    pixels = sorted({p[0] / 1e6 for s in series.values() for p in s})
    for ax, label in ((ax_t, 'forward time (s)'),
                      (ax_m, 'peak memory (GiB)')):
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        if pixels:  # one labelled tick per measured size
            ticks = [v for i, v in enumerate(pixels)
                     if i == 0 or v > 1.2 * pixels[i - 1]]
            ax.set_xticks(ticks, [f'{v:.2g}' for v in ticks])
        ax.set_yticks(*_log_ticks(ax))
        ax.set_xlabel('pixels (millions)')
        ax.set_ylabel(label)
        ax.grid(True, which='both', alpha=0.3)
    fig.suptitle('Backbone inference, batch 1')
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _log_ticks(ax):
    """Readable major ticks (1, 2, 5 x 10^k) within the y range."""
    lo, hi = ax.get_ylim()
    ticks = [m * 10**k for k in range(-3, 4) for m in (1, 2, 5)
             if lo <= m * 10**k <= hi]
    return ticks, [f'{t:g}' for t in ticks]
