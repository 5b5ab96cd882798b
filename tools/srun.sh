#!/usr/bin/env bash
# What slurm_train.sh and slurm_test.sh share: run tools/SCRIPT over srun, as
# mmdet's Slurm scripts do.
#   bash tools/srun.sh PARTITION JOB_NAME SCRIPT [ARGS]
# GPUS, GPUS_PER_NODE, CPUS_PER_TASK and SRUN_ARGS come from the environment;
# PYTHON as in torchrun.sh (the project's .venv unless one is active).
PARTITION=$1
JOB_NAME=$2
SCRIPT=$3
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/tools/launch_common.sh"

# A user's mistake is one line before srun starts.
for name in GPUS GPUS_PER_NODE CPUS_PER_TASK; do
  require_positive "$name" "${!name}"
done
if [ -z "$PARTITION" ] || [ -z "$JOB_NAME" ]; then
  echo "error: the SLURM partition and job name are empty; give them first: bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [ARGS]." >&2
  exit 2
fi
if ! command -v srun > /dev/null; then
  echo "error: srun was not found: tools/slurm_train.sh and slurm_test.sh run on a SLURM cluster; on one machine use tools/dist_train.sh CONFIG GPUS or tools/train.py." >&2
  exit 2
fi

set -x
PYTHONPATH="$ROOT:${PYTHONPATH:-}" \
srun -p "${PARTITION}" \
    --job-name="${JOB_NAME}" \
    --gres=gpu:"${GPUS_PER_NODE}" \
    --ntasks="${GPUS}" \
    --ntasks-per-node="${GPUS_PER_NODE}" \
    --cpus-per-task="${CPUS_PER_TASK}" \
    --kill-on-bad-exit=1 \
    ${SRUN_ARGS} \
    "$PYTHON" -u "$ROOT/tools/$SCRIPT" "${@:4}" --launcher=slurm
