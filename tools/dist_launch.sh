#!/usr/bin/env bash
# Run one of this folder's tools on NUM_PROCS processes per node with
# torchrun and mmengine's `--launcher pytorch` (used by dist_train.sh and
# dist_test.sh):
#
#   bash tools/dist_launch.sh TOOL.py NUM_PROCS [tool args...]
#
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR and PORT (default: one node,
# 127.0.0.1:29500). PYTHON selects the interpreter (default: python).
set -euo pipefail
TOOL=$1
PROCS=$2
exec "${PYTHON:-python}" -m torch.distributed.run \
    --nnodes="${NNODES:-1}" \
    --node_rank="${NODE_RANK:-0}" \
    --master_addr="${MASTER_ADDR:-127.0.0.1}" \
    --master_port="${PORT:-29500}" \
    --nproc_per_node="$PROCS" \
    "$(dirname "$0")/$TOOL" --launcher pytorch "${@:3}"
