"""Benchmark dense backbones: latency, throughput, memory and FLOPs by size.

Every measurement runs in a fresh process (so peak resident memory on the CPU
is that of the measurement alone) with the given thread count; warm-up runs
are excluded and the median of the timed runs is reported. FLOPs come from
mmengine's counter (fvcore's convention: one multiply-add counts as one
FLOP, so "GMAC" below); achieved GFLOP/s counts 2 FLOPs per multiply-add and
is shown next to the machine's measured fp32 matmul throughput.

    python tools/benchmark.py --models xcit_small_12_p16 swin_t vit_s16 \\
        --sizes 512x512 800x1344 --batch 1 2 --out-dir work_dirs/benchmark

Peers: any XCiT preset (``xcit_<arch>``), Swin-T and ResNet-50 (mmdet's),
ViT-S/16 and ViT-B/16 with global attention (timm's, position embeddings
resized to the input). Writes ``results.json``, ``results.md`` (a markdown
table) and ``results.png`` (time and memory against pixel count, log-log).
"""
import argparse
import json
import os
import os.path as osp
import resource
import statistics
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)

PEERS = ('swin_t', 'r50', 'vit_s16', 'vit_b16')


def build(name: str):
    """A backbone by benchmark name, in eval mode, random weights."""
    if name.startswith('xcit_'):
        from xcit_dense import XCiT
        return XCiT(arch=name[len('xcit_'):])
    if name in ('swin_t', 'r50'):
        from mmengine.registry import init_default_scope
        from mmdet.registry import MODELS
        init_default_scope('mmdet')
        if name == 'swin_t':
            return MODELS.build(dict(
                type='SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2],
                num_heads=[3, 6, 12, 24], window_size=7,
                out_indices=(0, 1, 2, 3)))
        return MODELS.build(dict(type='ResNet', depth=50,
                                 out_indices=(0, 1, 2, 3)))
    if name in ('vit_s16', 'vit_b16'):
        import timm
        arch = {'vit_s16': 'vit_small_patch16_224',
                'vit_b16': 'vit_base_patch16_224'}[name]
        model = timm.create_model(arch, pretrained=False, num_classes=0,
                                  dynamic_img_size=True)
        model.forward = model.forward_features
        return model
    raise SystemExit(f'unknown model {name!r}; use xcit_<preset> or one of '
                     f'{", ".join(PEERS)}')


def _outputs_sum(out):
    if isinstance(out, (list, tuple)):
        return sum(o.float().sum() for o in out)
    return out.float().sum()


def worker(args) -> dict:
    """One measurement in this (fresh) process."""
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model == 'matmul':
        n = 4096
        a, b = torch.randn(n, n), torch.randn(n, n)
        for _ in range(2):
            a @ b
        times = []
        for _ in range(max(args.repeat, 5)):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return dict(gflops_per_s=2 * n**3 / statistics.median(times) / 1e9)
    h, w = args.size
    model = build(args.model)
    x = torch.randn(args.batch, 3, h, w)
    result = dict(model=args.model, h=h, w=w, batch=args.batch,
                  mode=args.mode, threads=args.threads)
    if args.mode == 'infer':
        model.eval()
        from mmengine.analysis import FlopAnalyzer
        with torch.no_grad():
            flops = FlopAnalyzer(model, x[:1])
            flops.unsupported_ops_warnings(False)
            flops.uncalled_modules_warnings(False)
            result['gmac_per_image'] = flops.total() / 1e9

        def step():
            with torch.no_grad():
                model(x)
    else:
        model.train()

        def step():
            model.zero_grad(set_to_none=True)
            _outputs_sum(model(x)).backward()
    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    result['seconds'] = statistics.median(times)
    result['images_per_s'] = args.batch / result['seconds']
    # ru_maxrss is in KiB on Linux
    result['peak_rss_gib'] = resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss / 2**20
    if 'gmac_per_image' in result:
        result['achieved_gflops_per_s'] = (
            2 * result['gmac_per_image'] * args.batch / result['seconds'])
    return result


def measure(model, size, batch, mode, args) -> dict:
    cmd = [sys.executable, osp.abspath(__file__), '--worker',
           '--model', model, '--size', f'{size[0]}x{size[1]}',
           '--batch', str(batch), '--mode', mode,
           '--threads', str(args.threads), '--repeat', str(args.repeat),
           '--warmup', str(args.warmup)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return dict(model=model, h=size[0], w=size[1], batch=batch,
                    mode=mode, error=f'timeout ({args.timeout} s)')
    if proc.returncode != 0:
        killed = proc.returncode < 0 or 'MemoryError' in proc.stderr
        reason = ('out of memory' if killed else
                  (proc.stderr.strip().splitlines() or ['failed'])[-1])
        return dict(model=model, h=size[0], w=size[1], batch=batch,
                    mode=mode, error=reason)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def write_table(results, matmul, args, path):
    lines = [
        f'Threads: {args.threads}; median of {args.repeat} runs after '
        f'{args.warmup} warm-up; fp32; machine fp32 matmul: '
        f'{matmul:.0f} GFLOP/s. Memory: peak resident set of a fresh '
        'process per measurement (model and libraries included).', '',
        '| model | input | batch | mode | time (s) | images/s | peak RSS '
        '(GiB) | GMAC/image | achieved GFLOP/s |',
        '| --- | --- | --- | --- | --- | --- | --- | --- | --- |'
    ]
    for r in results:
        size = f'{r["h"]}x{r["w"]}'
        if 'error' in r:
            lines.append(f'| {r["model"]} | {size} | {r["batch"]} | '
                         f'{r["mode"]} | {r["error"]} | | | | |')
            continue
        gmac = r.get('gmac_per_image')
        achieved = r.get('achieved_gflops_per_s')
        lines.append(
            f'| {r["model"]} | {size} | {r["batch"]} | {r["mode"]} | '
            f'{r["seconds"]:.3f} | {r["images_per_s"]:.2f} | '
            f'{r["peak_rss_gib"]:.2f} | '
            f'{"" if gmac is None else f"{gmac:.1f}"} | '
            f'{"" if achieved is None else f"{achieved:.0f}"} |')
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')


def plot(results, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = {}
    for r in results:
        if 'error' not in r and r['mode'] == 'infer' and r['batch'] == 1:
            series.setdefault(r['model'], []).append(
                (r['h'] * r['w'], r['seconds'], r['peak_rss_gib']))
    for name, points in sorted(series.items()):
        points.sort()
        px = [p[0] / 1e6 for p in points]
        ax_t.plot(px, [p[1] for p in points], marker='o', label=name)
        ax_m.plot(px, [p[2] for p in points], marker='o', label=name)
    for ax, label in ((ax_t, 'forward time (s)'),
                      (ax_m, 'peak resident memory (GiB)')):
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('pixels (millions)')
        ax.set_ylabel(label)
        ax.grid(True, which='both', alpha=0.3)
    if series:
        ax_t.legend(fontsize=8)
    fig.suptitle('Inference, batch 1, fp32, CPU')
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_size(text):
    h, w = text.lower().split('x')
    return int(h), int(w)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--models', nargs='+',
                        default=['xcit_small_12_p16', 'xcit_small_12_p8',
                                 *PEERS])
    parser.add_argument('--sizes', nargs='+', type=parse_size,
                        default=[(512, 512), (800, 1344), (1024, 1024),
                                 (1600, 2688)])
    parser.add_argument('--batch', nargs='+', type=int, default=[1, 2])
    parser.add_argument('--modes', nargs='+', choices=['infer', 'train'],
                        default=['infer', 'train'])
    parser.add_argument('--threads', type=int, default=os.cpu_count())
    parser.add_argument('--repeat', type=int, default=3)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--timeout', type=float, default=900,
                        help='seconds per measurement')
    parser.add_argument('--out-dir', default='work_dirs/benchmark')
    # internal: one measurement in a fresh process
    parser.add_argument('--worker', action='store_true',
                        help=argparse.SUPPRESS)
    parser.add_argument('--model', help=argparse.SUPPRESS)
    parser.add_argument('--size', type=parse_size, help=argparse.SUPPRESS)
    parser.add_argument('--mode', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.batch = args.batch[0] if isinstance(args.batch, list) \
            else args.batch
        print(json.dumps(worker(args)))
        return
    for name in args.models:  # fail early on unknown names
        if not (name.startswith('xcit_') or name in PEERS):
            parser.error(f'unknown model {name!r}')

    os.makedirs(args.out_dir, exist_ok=True)
    matmul = measure('matmul', (0, 0), 1, 'infer', args)['gflops_per_s']
    print(f'fp32 matmul, {args.threads} threads: {matmul:.0f} GFLOP/s',
          flush=True)
    results = []
    for name in args.models:
        for size in args.sizes:
            for batch in args.batch:
                for mode in args.modes:
                    r = measure(name, size, batch, mode, args)
                    results.append(r)
                    print(json.dumps(r), flush=True)
    with open(osp.join(args.out_dir, 'results.json'), 'w') as f:
        json.dump(dict(matmul_gflops_per_s=matmul, threads=args.threads,
                       results=results), f, indent=1)
    write_table(results, matmul, args, osp.join(args.out_dir, 'results.md'))
    plot(results, osp.join(args.out_dir, 'results.png'))
    print(f'wrote {args.out_dir}/results.md, results.png, results.json')


if __name__ == '__main__':
    main()
