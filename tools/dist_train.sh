#!/usr/bin/env bash
# Multi-process training: bash tools/dist_train.sh CONFIG GPUS [ARGS]
# (environment: NNODES, NODE_RANK, MASTER_ADDR, PORT; see torchrun.sh)
exec bash "$(dirname "$0")/torchrun.sh" "$2" train.py "$1" "${@:3}"
