#!/usr/bin/env bash
# Print what the GPU machine has that this project depends on (run there first).
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvcc --version | tail -1
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cudnn", torch.backends.cudnn.version())'
ls /usr/lib/x86_64-linux-gnu/libcudnn.so* /usr/include/x86_64-linux-gnu/cudnn_version*.h /usr/include/cudnn_version*.h 2>/dev/null | head
grep -h -E "define CUDNN_(MAJOR|MINOR|PATCHLEVEL)" /usr/include/cudnn_version*.h /usr/include/x86_64-linux-gnu/cudnn_version*.h 2>/dev/null | head -3
ls /usr/lib/x86_64-linux-gnu/libnccl.so* /usr/local/cuda/lib64/libcublasLt.so* 2>/dev/null | head
grep -h -E "define NCCL_(MAJOR|MINOR|PATCH) " /usr/include/nccl.h /usr/local/cuda/include/nccl.h 2>/dev/null | head -3
which mpirun mpicc; mpirun --version 2>&1 | head -1
