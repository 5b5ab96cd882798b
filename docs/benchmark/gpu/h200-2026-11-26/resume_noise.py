"""Run-to-run noise of the GPU resume test's training (tests/test_cuda.py,
``_gpu_config``: the demo at depth 4, 32-wide heads, fp16 AMP, SyncBN, 6
iterations): three uninterrupted runs each with AdamW (the recipe) and with
SGD, all six at once on one GPU; the distances between their states after
iterations 2, 4 and 6, and the parameters that differ most.

    python3 docs/benchmark/gpu/h200-2026-11-26/resume_noise.py /tmp/rn
"""
import itertools
import subprocess
import sys
import time
from pathlib import Path

import torch

from xcit_dense.datasets.synthetic_coco import make_synthetic_coco

sys.path.insert(0, 'tests')
from test_cuda import _gpu_config  # noqa: E402

root = Path(sys.argv[1])
data = root / 'data'
make_synthetic_coco(str(data), num_train=8, num_val=4, seed=3)
procs, works = [], {}
t0 = time.time()
for opt in ('adamw', 'sgd'):
    d = root / opt
    d.mkdir(parents=True)
    cfg = _gpu_config(d, data)
    if opt == 'sgd':
        with open(cfg, 'a') as f:
            f.write("optim_wrapper = dict(optimizer=dict(_delete_=True, "
                    "type='SGD', lr=0.02, momentum=0.9, weight_decay=1e-4))\n")
    for i in range(3):
        w = d / f'run{i}'
        works.setdefault(opt, []).append(w)
        procs.append(subprocess.Popen(
            [sys.executable, 'tools/train.py', str(cfg), '--work-dir', str(w)],
            stdout=open(d / f'run{i}.log', 'w'), stderr=subprocess.STDOUT))
for p in procs:
    p.wait()
print('trained', round(time.time() - t0), 's, codes',
      [p.returncode for p in procs], flush=True)


def state(p):
    return torch.load(p, map_location='cpu', weights_only=False)['state_dict']


def dist(a, b, top=0):
    parts = {n: ((a[n].double() - b[n].double()) ** 2).sum().item()
             for n in a if a[n].is_floating_point()}
    if top:
        for n, v in sorted(parts.items(), key=lambda kv: -kv[1])[:top]:
            print(f'    {n}: {v ** 0.5:.3g} (numel {a[n].numel()})')
    return sum(parts.values()) ** 0.5


for opt, ws in works.items():
    s4 = [state(w / 'iter_4.pth') for w in ws]
    s6 = [state(w / 'iter_6.pth') for w in ws]
    s2 = [state(w / 'iter_2.pth') for w in ws]
    steps = dist(s6[0], s4[0])
    print(f'{opt}: iterations 5-6 moved {steps:.3g}')
    for i, j in itertools.combinations(range(3), 2):
        print(f'  runs {i},{j}: iter2 {dist(s2[i], s2[j]):.3g} iter4 '
              f'{dist(s4[i], s4[j]):.3g} iter6 {dist(s6[i], s6[j]):.3g} '
              f'(ratio {dist(s6[i], s6[j]) / steps:.3g})')
    print('  largest contributors, runs 0,1 at iter 6:')
    dist(s6[0], s6[1], top=8)
    logs = (ws[0].parent / 'run0.log').read_text().splitlines()
    print('  ', [line[-160:] for line in logs
                 if 'Iter(train) [6/6]' in line][:1])
