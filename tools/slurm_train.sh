#!/usr/bin/env bash
# Train on a Slurm cluster with mmengine's `--launcher slurm`: srun starts
# one task per GPU, and mmengine reads its rank, world size and master
# address from Slurm's environment.
#
#   GPUS=16 bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR \
#       [train.py args...]
#
# GPUS (total, default 8), GPUS_PER_NODE (default 8), CPUS_PER_TASK
# (default 5), SRUN_ARGS (extra srun flags) and PYTHON (default python)
# come from the environment; MASTER_PORT defaults to 29500.
set -euo pipefail
if [ $# -lt 4 ]; then
    echo "usage: $0 PARTITION JOB_NAME CONFIG WORK_DIR [train.py args...]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-}

# shellcheck disable=SC2086  # SRUN_ARGS holds several flags
exec srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" \
    --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 \
    $SRUN_ARGS \
    "${PYTHON:-python}" -u "$(dirname "$0")/train.py" "$CONFIG" \
    --work-dir="$WORK_DIR" --launcher slurm "${@:5}"
