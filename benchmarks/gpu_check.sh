#!/usr/bin/env bash
# The GPU check, in parts of under 8 minutes each (see benchmarks/gpu_check.py for what each part does):
#   bash benchmarks/gpu_check.sh part1                # on a machine with a GPU; then part2, part3
#   bash benchmarks/gpu_check.sh --dry-run all        # on the CPU at tiny sizes (the test suite runs this)
# Results: runs/gpu_check/<gpu>_torch-<version>_<date>/partN/ (summary.json, logs, results, plots).
# PYTHON picks the interpreter (default: .venv/bin/python if there is one, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
exec "$PYTHON" benchmarks/gpu_check.py "$@"
