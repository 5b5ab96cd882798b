#!/usr/bin/env bash
# What dist_train.sh and dist_test.sh share: run tools/SCRIPT in NPROC
# processes per node over torchrun, as mmdet's scripts do.
#   bash tools/torchrun.sh NPROC SCRIPT [ARGS]
# NNODES, NODE_RANK, MASTER_ADDR and PORT come from the environment. Without
# GPUs the processes run on the CPU over gloo.
set -e
NPROC=$1
SCRIPT=$2
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
exec "$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$NPROC" \
    --master_port="$PORT" \
    "$ROOT/tools/$SCRIPT" "${@:3}" --launcher pytorch
