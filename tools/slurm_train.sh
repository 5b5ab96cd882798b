#!/usr/bin/env bash
# Training on Slurm: GPUS=16 bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [ARGS]
exec bash "$(dirname "$0")/srun.sh" "$1" "$2" train.py "$3" --work-dir="$4" "${@:5}"
