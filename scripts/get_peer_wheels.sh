#!/usr/bin/env bash
# Download the wheels of the peer systems of the benchmarks into .whl/ (the GPU machine
# has no network, so they travel with the tree; .whl/ is ignored):
#   liger-kernel 0.8.5 (hf_liger), torchtitan 0.2.2 and torchao 0.18.0 (titan_*),
# plus the runtime dependencies of torchtitan that the GPU machine's torch 2.11 +
# transformers 5.17 image does not already have (by the image's package list as read on
# 2026-11-17) and that bench_e2e.py's import path needs:
#   tyro (+ docstring-parser, typeguard)  torchtitan.config imports tyro (its command line)
#   torchdata                            torchtitan.components.dataloader (stateful dataloader)
#   datasets (+ dill, multiprocess)      torchtitan.models.llama3's __init__ imports its validator
#                                        and text dataloader, which import datasets at import time;
#                                        dill and multiprocess are pinned by datasets 5.2.0 (its
#                                        other needs, pyarrow, pandas, xxhash, fsspec, huggingface-hub,
#                                        are in the image; it also imported with pyarrow 21 on the CPU)
#   einops                               a hard requirement of torchtitan 0.2.2 (in the image too;
#                                        only its flux model imports it, off bench_e2e.py's path)
# torchtitan 0.2.2's other hard requirements are in the image: tensorboard (torchtitan's
# metrics module imports torch.utils.tensorboard at import time, so it is needed, with
# protobuf and absl-py, also in the image), tokenizers, fsspec, pillow; tomli is tomllib on
# Python 3.12. torch itself is never downloaded.
# Target: CPython 3.12 on Linux x86_64 (the GPU machine's /opt/torch/.venv reports 3.12.3).
# Why 0.2.2: torchtitan 0.3.0 does not import with torch 2.11 (ImportError: cannot import
# name 'DataParallelMeshDims' from 'torch.distributed.fsdp', from torchtitan/distributed/fsdp.py);
# 0.2.2 (the newest older release) imports and builds its Llama 3 with torch 2.11.0 on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    --python-version 3.12 --implementation cp -d .whl "$@"; }
dl liger-kernel==0.8.5
dl torchtitan==0.2.2 torchao==0.18.0
dl tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 torchdata==0.11.0 \
    datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 einops==0.8.2
# wheels of torchtitan 0.3.0 and of its own pins, which earlier versions of this script fetched
# (two versions of one package in .whl/ stop the install on the GPU machine)
rm -f .whl/torchtitan-0.3.0-*.whl .whl/spmd_types-*.whl .whl/torch_checkpointing-*.whl
ls .whl
