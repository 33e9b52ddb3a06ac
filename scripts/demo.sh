#!/usr/bin/env bash
# Quick start, command 1: set everything up, then train and evaluate the
# MiTA-ViT + UPerNet demo through mmsegmentation's own tools.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python tools/run_demo.py "$@"
