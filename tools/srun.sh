#!/usr/bin/env bash
# What slurm_train.sh and slurm_test.sh share: run tools/SCRIPT over srun, as
# mmdet's Slurm scripts do.
#   bash tools/srun.sh PARTITION JOB_NAME SCRIPT [ARGS]
# GPUS, GPUS_PER_NODE, CPUS_PER_TASK and SRUN_ARGS come from the environment.
set -x
PARTITION=$1
JOB_NAME=$2
SCRIPT=$3
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

PYTHONPATH="$ROOT:${PYTHONPATH:-}" \
srun -p "${PARTITION}" \
    --job-name="${JOB_NAME}" \
    --gres=gpu:"${GPUS_PER_NODE}" \
    --ntasks="${GPUS}" \
    --ntasks-per-node="${GPUS_PER_NODE}" \
    --cpus-per-task="${CPUS_PER_TASK}" \
    --kill-on-bad-exit=1 \
    ${SRUN_ARGS} \
    "${PYTHON:-python}" -u "$ROOT/tools/$SCRIPT" "${@:4}" --launcher=slurm
