#!/usr/bin/env bash
# The benchmarks on the GPU machine, from the repository root:
#   installs the liger-kernel wheel carried in .whl/ (into /tmp/site, on PYTHONPATH),
#   builds train_llama, runs dev/bench/bench_e2e.py with its default settings for
#   Llama 3.2 1B and the cut Llama 3.1 8B, the per-kernel benchmark, then
#   dev/bench/report.py.
# Results are appended to dev/bench/results/e2e.jsonl and kernels.jsonl (per-run
# logs in dev/bench/results/logs/); docs/benchmarks.md and docs/img/ are rewritten.
# When $OUT is set, every record is also appended to $OUT/results/e2e.jsonl as
# it is made (so a run cut short still returns what it measured), and the
# results, logs and docs are copied under $OUT at the end.
#
# Usage: dev/bench/run_all.sh [PART...]      (default: build 1b 8b kernels report)
#   build          install the wheel, make -j16 train_llama
#   smoke          bench_e2e.py --quick (2 layers, T=2048; ~3 min): checks every system works
#   1b             Llama 3.2 1B, default settings (~10 min on an H100, 2.5 of them compile runs)
#   8b             Llama 3.1 8B cut to 8 layers (~9 min)
#   1b-recompute   train_llama alone on the 1B at recompute 0 and 2 (~3-4 min)
#   memory         the 1B at B=1 and B=4, T=2048: train_llama at every recompute level and
#                  HF + Liger, for the activation memory per sequence (~3 min)
#   kernels        the per-kernel benchmark, dev/bench/run_kernels.sh (~4 min)
#   report         docs/benchmarks.md and docs/img/*.png from dev/bench/results/
# With no argument every table is made in one run each, ~25 min in all.
# Where commands have a time limit, BUDGET_S=540 keeps each bench part under that
# many seconds (skipping the last runs, the compile ones first), and the systems
# can go in separate commands of one session, e.g.
#   BENCH_ARGS="--systems train_llama hf_liger hf_sdpa hf_eager" dev/bench/run_all.sh 1b
#   BENCH_ARGS="--systems hf_sdpa_compile" dev/bench/run_all.sh 1b
# Extra bench_e2e.py flags: BENCH_ARGS="--expandable-segments" dev/bench/run_all.sh 1b
set -uo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
cd "$(dirname "$0")/../.." || exit 1
parts="${*:-build 1b 8b kernels report}"
results=dev/bench/results
budget="${BUDGET_S:-0}"
mkdir -p "$results"
mirror=()
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT/results"
    mirror=(--mirror "$OUT/results/e2e.jsonl")
fi

setup_python() {
    if ! python3 -c 'import liger_kernel' 2> /dev/null && [ ! -d /tmp/site/liger_kernel ]; then
        ls .whl/*.whl > /dev/null 2>&1 || { echo "error: no wheel in .whl/ (scripts/get_peer_wheels.sh fetches them)"; return 1; }
        python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || return 1
    fi
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
}

bench() { # bench_e2e.py flags...
    # shellcheck disable=SC2086
    python3 dev/bench/bench_e2e.py --budget-s "$budget" ${mirror[@]+"${mirror[@]}"} ${BENCH_ARGS:-} "$@"
}

copy_out() {
    [ -n "${OUT:-}" ] || return 0
    cp -r "$results/." "$OUT/results/" 2> /dev/null
    if [ -f docs/benchmarks.md ]; then
        mkdir -p "$OUT/docs"
        cp docs/benchmarks.md "$OUT/docs/"
        [ -d docs/img ] && cp -r docs/img "$OUT/docs/"
    fi
    return 0
}

status=0
setup_python || status=1
for part in $parts; do
    echo "=== $part ($(date -u +%H:%M:%S))"
    case "$part" in
    build)
        make -j16 train_llama || { echo "error: make train_llama failed"; status=1; };;
    smoke)
        # shellcheck disable=SC2086
        python3 dev/bench/bench_e2e.py --quick ${BENCH_ARGS:-} || status=1;;
    1b)
        bench --models llama3.2-1b || status=1;;
    8b)
        bench --models llama3.1-8b-cut || status=1;;
    1b-recompute)
        bench --models llama3.2-1b --systems train_llama --train-llama-recompute 0 2 || status=1;;
    memory)
        bench --models llama3.2-1b --systems train_llama hf_liger --seq-lens 2048 --batch-sweep 4 \
            --train-llama-recompute 0 1 2 3 || status=1;;
    kernels)
        bash dev/bench/run_kernels.sh || status=1;;
    report)
        python3 dev/bench/report.py || status=1;;
    *)
        echo "error: unknown part '$part' (build, smoke, 1b, 8b, 1b-recompute, memory, kernels, report)"; status=1;;
    esac
    copy_out
done
echo "=== done ($(date -u +%H:%M:%S)), status $status"
exit $status
