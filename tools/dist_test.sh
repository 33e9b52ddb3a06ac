#!/usr/bin/env bash
# Evaluate a checkpoint on NUM_GPUS processes of this node with torchrun and
# mmengine's `--launcher pytorch` (see dist_train.sh for multi-node):
#
#   bash tools/dist_test.sh CONFIG CHECKPOINT NUM_GPUS [test.py args...]
#
# PYTHON selects the interpreter (default: python).
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 CONFIG CHECKPOINT NUM_GPUS [test.py args...]" >&2
    exit 2
fi
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
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
    "$(dirname "$0")/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch \
    "${@:4}"
