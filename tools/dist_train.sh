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
exec bash "$(dirname "$0")/dist_launch.sh" train.py "$2" "$1" "${@:3}"
