#!/usr/bin/env bash
# Multi-process training: bash tools/dist_train.sh CONFIG GPUS [ARGS]
# (environment: NNODES, NODE_RANK, MASTER_ADDR, PORT; see torchrun.sh)
if [ "$#" -lt 2 ]; then
  echo "error: bash tools/dist_train.sh CONFIG GPUS [ARGS] takes a config and the number of processes per node (GPUs), then tools/train.py's options; got $# argument(s)." >&2
  exit 2
fi
exec bash "$(dirname "$0")/torchrun.sh" "$2" train.py "$1" "${@:3}"
