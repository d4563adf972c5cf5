#!/usr/bin/env bash
# A two-host rehearsal on one GPU machine: two network namespaces joined by a veth
# pair stand for two hosts of one GPU each. One rank in each (GPU 0 and GPU 1, each
# its host's only GPU), a TCP rendezvous over the pair (no MPI), NCCL's socket
# transport over the veth (NCCL_SOCKET_IFNAME) and a host identity per namespace
# (NCCL_HOSTID), as two real hosts would run. Needs root and iproute2's ip: the
# machine's, or one carried in .carry/iproute2/ (scripts/carry_iproute2.sh puts
# this machine's there with its libraries; carry .carry to the GPU machine).
#
# Usage: scripts/two_host_netns.sh LOG_PREFIX [train_llama flags...]
#   writes LOG_PREFIX.jsonl (rank 0's log) and LOG_PREFIX.rank{0,1}.log; without
#   flags a short run of the small preset under ZeRO 3 sharded over hosts.
set -u
cd "$(dirname "$0")/.."
prefix=${1:?usage: scripts/two_host_netns.sh LOG_PREFIX [train_llama flags...]}
shift
[ "$(id -u)" = 0 ] || { echo "two_host_netns.sh: needs root (ip netns)" >&2; exit 2; }
if command -v ip > /dev/null; then
    ip() { command ip "$@"; }
elif [ -x .carry/iproute2/ip ]; then
    ip() { LD_LIBRARY_PATH="$PWD/.carry/iproute2" "$PWD/.carry/iproute2/ip" "$@"; }
else
    echo "two_host_netns.sh: needs iproute2's ip: install it, or carry one (scripts/carry_iproute2.sh)" >&2
    exit 2
fi
[ -x ./train_llama ] || { echo "two_host_netns.sh: build ./train_llama first (make gpu)" >&2; exit 2; }
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(--preset small -T 256 -B 2 --random-data --steps 20 --warmup 2 --lr 1e-3 --gemm-autotune 0
                                 --zero-stage 3 --shard-over host)
ns=(llmc_host0 llmc_host1)
cleanup() {
    for n in "${ns[@]}"; do ip netns del "$n" 2> /dev/null; done
}
trap cleanup EXIT
cleanup
set -e
for n in "${ns[@]}"; do ip netns add "$n"; done
ip link add llmc_veth0 type veth peer name llmc_veth1
for r in 0 1; do
    ip link set "llmc_veth$r" netns "${ns[$r]}"
    ip -n "${ns[$r]}" addr add "10.77.0.$((r + 1))/24" dev "llmc_veth$r"
    ip -n "${ns[$r]}" link set "llmc_veth$r" up
    ip -n "${ns[$r]}" link set lo up
done
set +e
pids=()
for r in 0 1; do
    # (a carried ip's library path must not reach the trainer: the outer shell's own value)
    ip netns exec "${ns[$r]}" env LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 CUDA_VISIBLE_DEVICES=$r \
        MASTER_ADDR=10.77.0.1 MASTER_PORT=29611 NCCL_SOCKET_IFNAME="llmc_veth$r" NCCL_HOSTID="netns-host$r" \
        NCCL_NVLS_ENABLE=0 timeout 600 ./train_llama "${flags[@]}" --log "$prefix.jsonl" > "$prefix.rank$r.log" 2>&1 &
    pids+=($!)
done
status=0
for r in 0 1; do
    wait "${pids[$r]}" || { echo "rank $r failed: $(tail -3 "$prefix.rank$r.log")"; status=1; }
done
grep -m1 "^ranks:" "$prefix.rank0.log"
grep -m1 "NET/Socket\|Using network" "$prefix.rank0.log"
tail -2 "$prefix.rank0.log"
exit $status
