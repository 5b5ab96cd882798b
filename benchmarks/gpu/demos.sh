#!/usr/bin/env bash
# The demos trained on one GPU as the recipes run on many: each through
# `tools/dist_train.sh CONFIG 1 --amp` (NCCL, fp16 AMP) with SyncBN, all at
# once (one GPU holds them; its machine's cores feed them), then evaluated
# by the training's last validation. Run from the project's root:
#
#   bash benchmarks/gpu/demos.sh OUT [CONFIG ...]
#
# Writes OUT/NAME.log per demo as it trains (work directories, with their
# checkpoints, under work_dirs/gpu_demos/), then prints each demo's wall
# time and final metrics and exits non-zero if one failed. Default: the
# Mask R-CNN, Cascade Mask R-CNN and Mask2Former COCO demos and the UperNet
# and Mask2Former ADE20K ones. Environment: PYTHON (the Python to run),
# DIST_TRAIN (default tools/dist_train.sh), CFG_OPTIONS (more
# --cfg-options, e.g. a shorter schedule).
set -u
OUT=${1:?usage: demos.sh OUT [CONFIG ...]}
shift
CONFIGS=("$@")
if [ ${#CONFIGS[@]} -eq 0 ]; then
  CONFIGS=(configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py
           configs/coco/demo_cascade_mask_rcnn_xcit_nano_synthetic.py
           configs/coco/demo_mask2former_xcit_nano_synthetic.py
           configs/ade20k/demo_upernet_xcit_nano_synthetic.py
           configs/ade20k/demo_mask2former_xcit_nano_synthetic.py)
fi
DIST_TRAIN=${DIST_TRAIN:-tools/dist_train.sh}
PY=${PYTHON:-python}
mkdir -p "$OUT"
"$PY" tools/make_synthetic_data.py coco data/synthetic_coco || exit 1
"$PY" tools/make_synthetic_data.py ade20k data/synthetic_ade20k || exit 1

port=29610
names=() pids=()
for config in "${CONFIGS[@]}"; do
  # the dataset's folder in the name: COCO's and ADE20K's Mask2Former demos
  # have the same file name, and one log and work directory each
  name=$(basename "$(dirname "$config")")_$(basename "$config" .py)
  # shellcheck disable=SC2086  # CFG_OPTIONS: several words
  ( start=$SECONDS
    PORT=$port bash "$DIST_TRAIN" "$config" 1 --amp \
        --work-dir "work_dirs/gpu_demos/$name" \
        --cfg-options sync_bn=torch ${CFG_OPTIONS:-}
    status=$?
    echo "[demos] $name: exit status $status after $((SECONDS - start)) s"
    exit $status ) > "$OUT/$name.log" 2>&1 &
  names+=("$name") pids+=($!)
  port=$((port + 1))
done

failed=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed=1
  log="$OUT/${names[$i]}.log"
  tail -n 1 "$log"
  # the last validation's metrics (mmengine's line after the epoch; its
  # progress lines have an eta)
  grep -E 'Iter\(val\) \[ *[0-9]+/[0-9]+\]' "$log" | grep -v 'eta:' |
      tail -n 1
done
exit $failed
