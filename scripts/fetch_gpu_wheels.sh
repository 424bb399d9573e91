#!/usr/bin/env bash
# Download the wheels the lent GPU machine lacks (it reaches no package index)
# into .whl/ (ignored by git), for Python 3.12 on x86_64. Pins match
# requirements/lock.txt where the package is also in the CPU environment.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl fla-core==0.6.0 einops==0.8.2 packaging==26.4 pydantic==2.14.4 pydantic_core==2.50.5 \
    annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0
ls .whl
