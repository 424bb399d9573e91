#!/usr/bin/env bash
# Set up (if needed), then answer the bundled decision requests with the built-in
# SmolLM2-135M-Instruct on CPU and print the accuracy and the tokens saved by forking.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/flide decide --model smollm2-135m --input examples/decisions.jsonl --output answers.jsonl "$@"
