#!/usr/bin/env bash
# Multi-process testing: bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [ARGS]
# (environment: NNODES, NODE_RANK, MASTER_ADDR, PORT; see torchrun.sh)
exec bash "$(dirname "$0")/torchrun.sh" "$3" test.py "$1" "$2" "${@:4}"
