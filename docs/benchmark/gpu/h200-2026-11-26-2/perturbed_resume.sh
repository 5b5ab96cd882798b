#!/usr/bin/env bash
# How far the Mask R-CNN demo's final metrics move when its weights are
# nudged once, halfway: on the CPU (deterministic), train iterations 1-400,
# add N(0, 1e-4) noise to every weight of the checkpoint (seeds 1 and 2;
# not the optimizer's state, not BatchNorm's running statistics), resume
# each to 800 and evaluate. Unnudged, the same resume is the uninterrupted
# run bit for bit (tests/test_interruptions.py): `make demo`'s figures.
# Run from the project's root: bash THIS_FILE OUT (about 17 min on 2 cores).
set -eu
OUT=${1:?usage: perturbed_resume.sh OUT}
CFG=configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
"$PY" tools/make_synthetic_data.py coco data/synthetic_coco
"$PY" tools/train.py $CFG --work-dir "$OUT/base" \
    --cfg-options train_cfg.max_iters=400 > "$OUT/base.log" 2>&1
for seed in 1 2; do
  "$PY" - "$OUT/base/iter_400.pth" "$OUT/nudged$seed.pth" $seed <<'EOF'
import sys
import torch
src, dst, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
checkpoint = torch.load(src, map_location='cpu', weights_only=False)
generator = torch.Generator().manual_seed(seed)
for name, value in checkpoint['state_dict'].items():
    if value.is_floating_point() and 'running' not in name:
        value.add_(torch.randn(value.shape, generator=generator) * 1e-4)
torch.save(checkpoint, dst)
EOF
done
for seed in 1 2; do
  OMP_NUM_THREADS=1 "$PY" tools/train.py $CFG --work-dir "$OUT/run$seed" \
      --cfg-options load_from="$OUT/nudged$seed.pth" resume=True \
      > "$OUT/run$seed.log" 2>&1 &
done
wait
grep -h 'Iter(val) \[25/25\]' "$OUT"/run*.log | grep -v eta
