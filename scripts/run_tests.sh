#!/usr/bin/env bash
# Set up (if needed), then run the whole test suite on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# --durations: the slowest tests in every run (CI keeps the suite well inside its time).
exec .venv/bin/python -m pytest -q --durations=25 "$@"
