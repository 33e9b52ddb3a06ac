#!/usr/bin/env bash
# The GPU suite (python -m mmseg_mita.bench gpu; its help lists the parts):
#
#   bash tools/gpu_check.sh OUT_DIR
#
# Runs from a plain copy of the repository (PYTHONPATH=<repo>) with python
# (PYTHON, else python3 or python) holding torch, triton, numpy and pytest;
# installs nothing. GPU_CHECK_SECONDS (default 470) bounds the whole run;
# GPU_CHECK_CPU_SMOKE=1 runs the same parts on the CPU at tiny sizes. OUT_DIR
# gets one log and one JSON per part, summary.tsv, summary.txt and
# targets.json; the exit status is 0 only if every part passed.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -ne 1 ]; then
    echo "usage: bash tools/gpu_check.sh OUT_DIR" >&2
    exit 2
fi
PY=""
for candidate in ${PYTHON:-} python3 python; do
    if "$candidate" -c 'import torch' >/dev/null 2>&1; then
        PY=$candidate
        break
    fi
done
if [ -z "$PY" ]; then
    echo "gpu_check: no python with torch (set PYTHON=/path/to/python)" >&2
    exit 2
fi
SMOKE=""
[ "${GPU_CHECK_CPU_SMOKE:-0}" = 1 ] && SMOKE=--cpu-smoke
cd "$ROOT" || exit 2
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m mmseg_mita.bench \
    gpu "$1" --seconds "${GPU_CHECK_SECONDS:-470}" $SMOKE
