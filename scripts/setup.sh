#!/usr/bin/env bash
# Set up .venv/ with mmseg_mita and its stack. Idempotent: on a ready machine
# it checks the environment and returns in seconds.
#
#   PYTHON=python3.11   interpreter for the venv (default: python3.11)
#   TORCH_SPEC=...      torch to install when the venv has none
#                       (default: torch==2.13.0, a CPU build here). A torch
#                       already in .venv (e.g. your CUDA build) is kept.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
LOG="$VENV/setup.log"
PY=${PYTHON:-python3.11}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
CONSTRAINTS="$ROOT/scripts/constraints.txt"
STAMP="$VENV/.setup-stamp"

fail() {
    echo "setup: FAILED: $1" >&2
    if [ -f "$LOG" ]; then
        echo "setup: last lines of $LOG:" >&2
        tail -n 15 "$LOG" | sed 's/^/    /' >&2
    fi
    exit 1
}

step() {  # step "what" command...
    local what=$1
    shift
    echo "setup: $what"
    echo "=== $what: $*" >>"$LOG"
    "$@" >>"$LOG" 2>&1 || fail "$what"
}

command -v "$PY" >/dev/null 2>&1 ||
    fail "$PY not found; install Python 3.11 or set PYTHON=/path/to/python3"

stamp() {
    cat setup.py pyproject.toml mmseg_mita/version.py scripts/setup.sh \
        "$CONSTRAINTS" | sha256sum | cut -d' ' -f1
}

stack_ready() {
    "$VENV/bin/python" - <<'PY' >/dev/null 2>&1
import mmcv, mmcv.ops, mmseg.models, mmseg_mita  # noqa: F401
assert mmcv.__version__ == '2.1.0'
PY
}

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] &&
    [ "$(cat "$STAMP")" = "$(stamp)" ] && stack_ready; then
    echo "setup: .venv is ready"
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV" || fail "could not create $VENV with $PY (on Debian: apt-get install python3-venv)"
fi
: >"$LOG"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

step "installing build tools" "${PIP[@]}" install -c "$CONSTRAINTS" \
    "setuptools<81" wheel ninja psutil
if "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
    echo "setup: keeping torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
else
    step "installing $TORCH_SPEC" "${PIP[@]}" install -c "$CONSTRAINTS" "$TORCH_SPEC"
fi
step "installing mmengine and numpy" "${PIP[@]}" install -c "$CONSTRAINTS" \
    "mmengine>=0.10.0,<0.11" "numpy<2"
if ! "$VENV/bin/python" -c 'import mmcv, mmcv.ops; assert mmcv.__version__ == "2.1.0"' >/dev/null 2>&1; then
    echo "setup: mmcv 2.1.0 with compiled ops: the first build takes about 20 minutes on 2 cores; pip caches the wheel for later runs"
    export MMCV_WITH_OPS=1
    step "building/installing mmcv 2.1.0" "${PIP[@]}" install \
        --no-build-isolation -c "$CONSTRAINTS" mmcv==2.1.0
fi
step "installing mmseg_mita (editable) with mmsegmentation 1.2.2" \
    "${PIP[@]}" install --no-build-isolation -c "$CONSTRAINTS" -e ".[tests,deploy]"
stack_ready || {
    "$VENV/bin/python" -c 'import mmcv, mmcv.ops, mmseg.models, mmseg_mita' >>"$LOG" 2>&1
    fail "the installed stack does not import"
}
stamp >"$STAMP"
echo "setup: done ($VENV)"
