#!/usr/bin/env bash
# Multi-process testing over torchrun: bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [ARGS]
# NNODES, NODE_RANK, MASTER_ADDR and PORT come from the environment, as in
# mmdet. Without GPUs the processes test on the CPU over gloo.
set -e
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# The project's environment unless one is active or PYTHON is set.
if [ -z "${PYTHON:-}" ]; then
  if [ -z "${VIRTUAL_ENV:-}" ] && [ -x "$ROOT/.venv/bin/python" ]; then
    PYTHON="$ROOT/.venv/bin/python"
  else
    PYTHON=python
  fi
fi

PYTHONPATH="$ROOT:${PYTHONPATH:-}" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" \
    --master_port="$PORT" \
    "$ROOT/tools/test.py" \
    "$CONFIG" "$CHECKPOINT" \
    --launcher pytorch "${@:4}"
