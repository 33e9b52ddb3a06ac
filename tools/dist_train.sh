#!/usr/bin/env bash
# Train on NUM_GPUS processes of this node with torchrun and mmengine's
# `--launcher pytorch` (one process per GPU; on a CPU machine the processes
# use the gloo backend):
#
#   bash tools/dist_train.sh CONFIG NUM_GPUS [train.py args...]
#
# Multi-node: run it on every node with the same MASTER_ADDR/PORT, e.g.
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash tools/dist_train.sh ...
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 bash tools/dist_train.sh ...
# PYTHON selects the interpreter (default: python).
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 CONFIG NUM_GPUS [train.py args...]" >&2
    exit 2
fi
CONFIG=$1
GPUS=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}

exec "${PYTHON:-python}" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --master_port="$PORT" \
    --nproc_per_node="$GPUS" \
    "$(dirname "$0")/train.py" "$CONFIG" --launcher pytorch "${@:3}"
