#!/usr/bin/env bash
# One prepared check for a session lent a GPU (15 minutes in all): calibrate, then validate three
# layouts, in at most 6 minutes so that it can be run again. See bench/gpu_check.py.
#   bench/gpu_check.sh [--quick] [--out DIR] [--profiles DIR] [--recompute none,selective,full]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
exec timeout 360 "$PYTHON" bench/gpu_check.py "$@"
