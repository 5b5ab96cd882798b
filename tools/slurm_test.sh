#!/usr/bin/env bash
# Testing on Slurm: bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [ARGS]
if [ "$#" -lt 4 ]; then
  echo "error: GPUS=N bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [ARGS] takes the partition, a job name, a config and a checkpoint, then tools/test.py's options; got $# argument(s)." >&2
  exit 2
fi
exec bash "$(dirname "$0")/srun.sh" "$1" "$2" test.py "$3" "$4" "${@:5}"
