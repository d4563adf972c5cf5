#!/usr/bin/env bash
# Runs "$@" as if this process sat on host number rank / GPUS_PER_HOST, so that
# one machine stands in for several hosts: NCCL_HOSTID=standin-<n> makes NCCL use
# its network transport (sockets here) between such "hosts" and NVLink inside
# each, and train_llama groups its ranks by the same variable
# (llmc/parallel/process_groups.h). The rank comes from mpirun's, torchrun's or Slurm's
# variables.
#   mpirun -np 4 -x GPUS_PER_HOST=2 scripts/as_hosts.sh ./train_llama ...   # 2 "hosts" x 2 GPUs
set -eu
rank=${OMPI_COMM_WORLD_RANK:-${RANK:-${SLURM_PROCID:-}}}
[ -n "$rank" ] || { echo "as_hosts.sh: no rank (mpirun, RANK or SLURM_PROCID)" >&2; exit 2; }
per=${GPUS_PER_HOST:?as_hosts.sh: set GPUS_PER_HOST to the GPUs of each stand-in host}
export NCCL_HOSTID="standin-$((rank / per))"
exec "$@"
