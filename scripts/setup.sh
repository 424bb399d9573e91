#!/usr/bin/env bash
# Create .venv with everything Flide needs, from requirements/lock.txt (a complete,
# pinned CPU environment: torch, transformers, SGLang's Python layer without its
# GPU packages, the SmolLM2 and Qwen3 tokenizer asset packages). Idempotent: a
# second run with the same lock file and pyproject does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
stamp=.venv/.flide-setup
want=$(cat requirements/lock.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "setup: Python 3.11 or newer is needed (set PYTHON=...)" >&2
    exit 2
fi
echo "setup: installing into .venv (first run takes a few minutes)" >&2
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# --no-deps: the lock file is the whole environment; SGLang's declared
# dependencies include GPU-only packages that a CPU machine must not pull.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements/lock.txt
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .
echo "$want" > "$stamp"
