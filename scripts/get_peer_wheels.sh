#!/usr/bin/env bash
# Download the wheels of the peer systems of the benchmarks into .whl/ (the GPU machine
# has no network, so they travel with the tree; .whl/ is ignored):
#   liger-kernel 0.8.5 (hf_liger), torchtitan 0.3.0 and torchao 0.18.0 (titan_*),
# plus the runtime dependencies of torchtitan that the GPU machine's torch 2.11 +
# transformers 5.17 environment does not already have and that bench_e2e.py's import
# path needs: spmd_types (pinned by torchtitan), tyro (+ docstring-parser, typeguard),
# torch_checkpointing, torchdata, einops. torch itself is never downloaded.
# torchtitan's other hard requirements (datasets, tensorboard, wandb, pillow) serve only
# its own trainer, data and logging stack, which bench_e2e.py does not use.
# Target: CPython 3.12 on Linux x86_64 (the GPU machine's /opt/torch/.venv reports 3.12.3).
# Known: torchtitan 0.3.0 does not import with that machine's torch 2.11 (ImportError:
# cannot import name 'DataParallelMeshDims' from 'torch.distributed.fsdp', seen with the
# torch 2.11.0 wheel on the CPU); the benchmark's torchtitan rows wait on that.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    --python-version 3.12 --implementation cp -d .whl "$@"; }
dl liger-kernel==0.8.5
dl torchtitan==0.3.0 torchao==0.18.0
dl spmd_types==0.2.3 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 torch_checkpointing==0.1.1 \
    torchdata==0.11.0 einops==0.8.2
ls .whl
