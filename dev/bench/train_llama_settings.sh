#!/usr/bin/env bash
# The train_llama settings that issue #3's targets name, on one GPU, random
# tokens, AdamW, fp32 master weights, Llama 3.2 1B shape:
#   throughput and peak memory at B=4 and B=8, T=2048, per recompute level;
#   the longest T that trains at B=1, without recompute (0) and with (1, 2);
#   level3: recompute 3 (only each layer's input kept) against 2 at B=1, T=8192
#   (its cost in tokens/s) and T=131072 (its memory);
#   bestb: the best B at T=2048 for issue 14's throughput target, B = 8, 12, 16
#   at recompute 0 and 1, and 20, 24 at 0 (the optimizer's fixed time per step
#   shrinks per token);
#   long8b: Llama 3.1 8B on one GPU (an H200: its weights, gradients and AdamW
#   state take ~105 GiB), the longest T at B=1 per recompute level 1-3, each
#   level's T rising until the first OOM;
#   fp8: issue 15's --fp8 against bf16, side by side (alternating, ROUNDS=2
#   rounds): the 1B at B=8 and 16, T=2048, recompute 0, and the Llama 3.1 8B
#   shape cut to 8 or 12 layers (untied), T=2048, recompute 1 (below);
#   fp8recipes: issue 15's scaling recipes side by side (alternating, ROUNDS
#   rounds): bf16 and --fp8-recipe tensor, row and block at the fp8 targets'
#   shapes, the 1B at B=16 (recompute 0) and the 8B cut to 8 layers at B=8
#   (recompute 1), T=2048;
#   offload8b: issue 31, Llama 3.1 8B at T=8192 with --offload optimizer on one
#   GPU: a 0.5M-token batch at B=1 and 2 (64 and 32 micro-steps a step), one
#   micro-step a step with step 3 profiled (the optimizer's line is the time the
#   step waits for the host), and the 0.5M batch without offload (OOM on an
#   80 GB H100; the comparison on an H200).
# Each setting runs a few steps; the summary line per setting is the median
# tokens/s of the steps after the first, the MFU and the peak memory, or OOM.
# Writes $OUT/settings.jsonl (or ./settings.jsonl) and prints a table.
# Usage: dev/bench/train_llama_settings.sh [throughput] [longest] [level3] [bestb] [long8b] [fp8] [fp8recipes]
#        [offload8b]
# Extra train_llama flags for one run: FLAGS="..." (recorded as "flags").
set -u
cd "$(dirname "$0")/../.."
out="${OUT:-.}"
mkdir -p "$out"
results="$out/settings.jsonl"
parts="${*:-throughput longest}"

run() { # B T recompute steps [model]
    local B=$1 T=$2 r=$3 steps=$4 model=${5:-llama3.2-1b} flags="${FLAGS:-}"
    local log="$out/run_${5:+$5_}B$1_T$2_r$3$(echo "$flags" | tr -d ' -')"
    # shellcheck disable=SC2086 # FLAGS is a list of flags
    timeout 300 ./train_llama --preset "$model" --random-data -B "$B" -T "$T" --recompute "$r" \
        --steps "$steps" --warmup 1 --lr 1e-4 --log "$log.jsonl" $flags > "$log.log" 2>&1
    local rc=$?
    python3 - "$B" "$T" "$r" "$rc" "$log" "$model" "$flags" >> "$results" <<'PY'
import json, statistics, sys
B, T, r, rc, log, model = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
rec = {"system": "train_llama", "model": model, "B": B, "T": T, "recompute": r}
if sys.argv[7]:
    rec["flags"] = sys.argv[7]
steps = []
try:
    recs = [json.loads(l) for l in open(log + ".jsonl") if l.strip()]
    steps = [s for s in recs if "loss" in s]
    if recs and "run" in recs[0]:
        rec["commit"] = recs[0]["run"].get("commit")
except (OSError, ValueError):
    pass
text = open(log + ".log").read()
if rc != 0 or len(steps) < 2:
    rec["status"] = "OOM" if "out of GPU memory" in text or "out of memory" in text.lower() else f"failed (exit {rc})"
    rec["error"] = [l for l in text.splitlines() if l.startswith("error")][:1]
else:
    later = steps[1:]
    rec.update(status="ok", tokens_per_s=statistics.median(s["tokens_per_s"] for s in later),
               mfu=statistics.median(s["mfu"] for s in later), peak_mem_gib=max(s["peak_mem_gib"] for s in steps),
               device_mem_gib=max(s["device_mem_gib"] for s in steps), loss_last=steps[-1]["loss"],
               host_peak_gib=max(s.get("host_peak_gib", 0) for s in steps))
print(json.dumps(rec))
PY
    tail -1 "$results"
}

for p in $parts; do
    case "$p" in
    fp8)
        # the 8B cut (layers, B, tokens a step): B=4 and 8, then 4 micro-steps a step (--total-batch: the
        # optimizer's time and the weights' quantisation spread over 4x the tokens), and 12 layers at B=4 (the
        # most that fit with B=4 on an H100)
        for round in $(seq "${ROUNDS:-2}"); do
            for B in 8 16; do FLAGS="" run $B 2048 0 12; FLAGS="--fp8" run $B 2048 0 12; done
            for cut in "8 4" "8 8" "8 4 32768" "8 8 65536" "12 4"; do
                set -- $cut
                for f in "" "--fp8"; do
                    FLAGS="--n-layer $1 --untied${3:+ --total-batch $3} $f" run "$2" 2048 1 "${FP8_8B_STEPS:-8}" llama3.1-8b
                done
            done
        done;;
    fp8recipes)
        for round in $(seq "${ROUNDS:-2}"); do
            for f in "" "--fp8-recipe tensor" "--fp8-recipe row" "--fp8-recipe block"; do
                FLAGS="$f" run 16 2048 0 12
                FLAGS="--n-layer 8 --untied $f" run 8 2048 1 "${FP8_8B_STEPS:-8}" llama3.1-8b
            done
        done;;
    throughput)
        for r in 0 1 2; do run 4 2048 $r 12; done
        run 8 2048 1 10
        run 8 2048 2 10;;
    longest)
        for T in 16384 32768 49152; do run 1 $T 0 4; done
        for T in 32768 65536 131072; do run 1 $T 2 4; done;;
    level3)
        for r in 2 3; do run 1 8192 $r 8; done
        for r in 2 3; do run 1 131072 $r 3; done;;
    bestb)
        for B in 8 12 16; do for r in 0 1; do run $B 2048 $r 10; done; done
        for B in 20 24; do run $B 2048 0 10; done;;
    offload8b)
        for B in 1 2; do FLAGS="--offload optimizer --total-batch 524288" run $B 8192 1 3 llama3.1-8b; done
        FLAGS="--offload optimizer --profile-step 3" run 1 8192 1 5 llama3.1-8b
        grep -A14 "profile of step" "$out"/run_llama3.1-8b_B1_T8192_r1*profilestep3.log | head -16
        FLAGS="--total-batch 524288" run 1 8192 1 3 llama3.1-8b;;
    long8b)
        for level in "1 4096 8192 16384" "2 8192 16384 32768" "3 16384 32768 65536"; do
            set -- $level
            r=$1; shift
            for T in "$@"; do
                run 1 "$T" "$r" 3 llama3.1-8b
                tail -1 "$results" | grep -q '"status": "ok"' || break
            done
        done;;
    esac
done
