#!/usr/bin/env bash
# Download the liger-kernel wheel (pure Python + Triton) into .whl/ for the
# benchmarks; the GPU machine has no network, so the wheel travels with the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl liger-kernel==0.8.5
ls .whl
