#!/usr/bin/env bash
# Multi-process testing: bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [ARGS]
# (environment: NNODES, NODE_RANK, MASTER_ADDR, PORT; see torchrun.sh)
if [ "$#" -lt 3 ]; then
  echo "error: bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [ARGS] takes a config, a checkpoint and the number of processes per node (GPUs), then tools/test.py's options; got $# argument(s)." >&2
  exit 2
fi
exec bash "$(dirname "$0")/torchrun.sh" "$3" test.py "$1" "$2" "${@:4}"
