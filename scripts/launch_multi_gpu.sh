#!/usr/bin/env bash
# Start ./train_llama on several GPUs, one process per GPU. Every argument after
# the mode goes to train_llama.
#
#   scripts/launch_multi_gpu.sh mpirun N [train_llama flags]
#       mpirun -np N on this host (Open MPI; MPI passes NCCL's id when
#       train_llama was built with MPI, else MASTER_ADDR/MASTER_PORT below).
#       Several hosts: HOSTS=a:8,b:8 scripts/launch_multi_gpu.sh mpirun 16 ...
#   scripts/launch_multi_gpu.sh local N [train_llama flags]
#       no MPI: starts N processes here with torchrun-style RANK, WORLD_SIZE,
#       LOCAL_RANK and a TCP rendezvous on MASTER_ADDR:MASTER_PORT.
#   scripts/launch_multi_gpu.sh node NODE_RANK NODES GPUS_PER_NODE [flags]
#       no MPI, several hosts: run this on every host with its NODE_RANK
#       (0 on the host named by MASTER_ADDR), e.g. from a scheduler's job script.
# NCCL_NVLS_ENABLE=0 is set (the lent GPU machines need NVLink multicast off).
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
export MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}" MASTER_PORT="${MASTER_PORT:-29500}"
mode="${1:-}"
case "$mode" in
mpirun)
    n="$2"
    shift 2
    hosts=()
    [ -n "${HOSTS:-}" ] && hosts=(--host "$HOSTS")
    exec mpirun -np "$n" "${hosts[@]}" --bind-to none -x NCCL_NVLS_ENABLE -x MASTER_ADDR -x MASTER_PORT \
        ./train_llama "$@";;
local | node)
    if [ "$mode" = local ]; then
        node=0 nodes=1 per_node="$2"
        shift 2
    else
        node="$2" nodes="$3" per_node="$4"
        shift 4
    fi
    pids=()
    trap 'kill "${pids[@]}" 2> /dev/null' INT TERM
    for ((l = 0; l < per_node; l++)); do
        RANK=$((node * per_node + l)) WORLD_SIZE=$((nodes * per_node)) LOCAL_RANK=$l LOCAL_WORLD_SIZE=$per_node \
            ./train_llama "$@" &
        pids+=($!)
    done
    status=0
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    exit $status;;
*)
    sed -n '2,18p' "$0"
    exit 1;;
esac
