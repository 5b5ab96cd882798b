#!/usr/bin/env bash
# Testing on Slurm: bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [ARGS]
exec bash "$(dirname "$0")/srun.sh" "$1" "$2" test.py "$3" "$4" "${@:5}"
