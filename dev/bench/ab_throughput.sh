#!/usr/bin/env bash
# Throughput of two train_llama binaries side by side on the same GPU, in one
# run: A and B alternate (A B A B ...) with the same flags, so drift of the
# machine (clocks, temperature) falls on both; each run's number is the median
# tokens/s of its steps after the first, and each binary's result the median
# over its runs. For a change that must not cost speed (a refactor), A is the
# binary before it and B after. Prints one line per run and the ratio B / A;
# the records go to $OUT/ab.jsonl (or ./ab.jsonl). A_FLAGS="..." and B_FLAGS="..." add flags to one side only:
# the same binary twice then compares two settings.
#   dev/bench/ab_throughput.sh A_BINARY B_BINARY ROUNDS [train_llama flags...]
# e.g. dev/bench/ab_throughput.sh old/train_llama ./train_llama 3 --preset llama3.2-1b -B 8 -T 2048 --random-data --steps 15
#      B_FLAGS="--logits-budget-mb 1024" dev/bench/ab_throughput.sh ./train_llama ./train_llama 3 --preset qwen2.5-1.5b ...
set -u
if [ $# -lt 3 ]; then
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    exit 1
fi
a=$1 b=$2 rounds=$3
shift 3
out="${OUT:-.}"
mkdir -p "$out"
results="$out/ab.jsonl"
: > "$results"
for ((i = 1; i <= rounds; i++)); do
    for side in A B; do
        bin=$a side_flags=${A_FLAGS:-}
        [ $side = B ] && bin=$b side_flags=${B_FLAGS:-}
        read -r -a extra <<< "$side_flags"
        log="$out/ab_${side}_$i"
        timeout 300 "$bin" "$@" "${extra[@]}" --log "$log.jsonl" > "$log.log" 2>&1
        python3 - "$side" "$i" "$?" "$bin" "$log" "$side_flags" >> "$results" <<'PY'
import json, statistics, sys
side, run, rc, binary, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
steps = []
try:
    steps = [json.loads(l) for l in open(log + ".jsonl") if '"loss"' in l]
except (OSError, ValueError):
    pass
rec = {"side": side, "run": run, "binary": binary, "flags": sys.argv[6], "exit": rc, "steps": len(steps)}
if rc == 0 and len(steps) > 1:
    rec.update(tokens_per_s=statistics.median(s["tokens_per_s"] for s in steps[1:]),
               peak_mem_gib=max(s["peak_mem_gib"] for s in steps), losses=[s["loss"] for s in steps])
print(json.dumps(rec))
PY
        tail -1 "$results" | python3 -c "import json,sys; r=json.load(sys.stdin); print(r['side'], r['run'], r.get('tokens_per_s', 'FAILED (exit %d)' % r['exit']), 'tok/s', r.get('peak_mem_gib', ''), 'GiB')"
    done
done
python3 - "$results" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
med = {}
for side in "AB":
    ok = [r["tokens_per_s"] for r in recs if r["side"] == side and "tokens_per_s" in r]
    med[side] = statistics.median(ok) if ok else None
    print(f"{side}: median {med[side]} tok/s over {len(ok)} runs")
if med["A"] and med["B"]:
    print(f"B / A = {med['B'] / med['A']:.4f}")
first = {r["side"]: r["losses"] for r in recs if "losses" in r and r["run"] == 1}
for side in first:  # the same seed: the same losses, up to the atomic attention backward's last bits
    print(f"{side}: first losses {first[side][:4]}")
PY
