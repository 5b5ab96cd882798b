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
source "$ROOT/tools/launch_common.sh"

# A user's mistake is one line, not torchrun's traceback: the count of
# processes, and (on the first node, which serves the rendezvous) the port.
require_positive "the number of processes per node (GPUS: bash tools/dist_train.sh CONFIG GPUS [ARGS], tools/dist_test.sh CONFIG CHECKPOINT GPUS [ARGS])" "$NPROC"
if [ "$NODE_RANK" = 0 ] && ! "$PYTHON" -c '
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))' "$MASTER_ADDR" "$PORT" 2>/dev/null; then
  echo "error: port $PORT on $MASTER_ADDR, where the first node serves the rendezvous, is in use or cannot be bound (another run's?); set PORT to a free one, e.g. PORT=29501 bash tools/dist_train.sh ..." >&2
  exit 2
fi

# torchrun itself; a failed process ends it with that process's status
# and one line, not torchrun's traceback (xcit_dense/launch.py, run by its
# path: the launcher imports torch alone, not this package)
PYTHONPATH="$ROOT:${PYTHONPATH:-}" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} \
exec "$PYTHON" "$ROOT/xcit_dense/launch.py" \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$NPROC" \
    --master_port="$PORT" \
    "$ROOT/tools/$SCRIPT" "${@:3}" --launcher pytorch
