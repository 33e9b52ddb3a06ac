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
exec bash "$(dirname "$0")/dist_launch.sh" test.py "$3" "$1" "$2" "${@:4}"
