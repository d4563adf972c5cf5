#!/usr/bin/env bash
# Issue #15's convergence check on the GPU: the same model, data, seed and batch
# order trained in bf16 and with each FP8 scaling recipe (--fp8-recipe tensor,
# row, block), each FP8 run's loss to stay within 1% of the bf16 run's. Model: the 'small' preset widened to d_model 768, 12 layers,
# 12 heads (4 key/value), ffn 2048, the Llama 3 vocabulary tied: 174M
# parameters. Data: the default corpus (data/shards, carried to the GPU
# machine), B=16, T=1024, 1000 steps, AdamW lr 6e-4 (cosine, 100 warm-up),
# val loss every 100 steps. Writes $OUT/fp8_conv_MODE.jsonl per run (MODE bf16,
# tensor, row, block), the plot $OUT/fp8_convergence.png (plot_log.py) and
# $OUT/fp8_convergence.json: each run's mean train loss over the last 100
# steps, last val loss and median tokens/s, and each FP8 run's relative
# differences from bf16.
# Usage: dev/bench/fp8_convergence.sh [STEPS [MODE...]]   (about 90 s a run on an H100)
set -u
cd "$(dirname "$0")/../.." || exit 1
out="${OUT:-.}"
steps="${1:-1000}"
shift $(($# > 0 ? 1 : 0))
modes=(bf16 tensor row block)
[ $# -gt 0 ] && modes=("$@")
ls data/shards/corpus_train_*.bin > /dev/null 2>&1 || { echo "error: no data/shards/corpus_train_*.bin (data/prepare.py makes them)"; exit 1; }
model=(--preset small --d-model 768 --n-layer 12 --n-head 12 --n-kv-head 4 --ffn-dim 2048)
for mode in "${modes[@]}"; do
    timeout 900 ./train_llama "${model[@]}" --train 'data/shards/corpus_train_*.bin' --val 'data/shards/corpus_val_*.bin' \
        -B 16 -T 1024 --steps "$steps" --lr 6e-4 --warmup 100 --eval-every 100 --seed 1337 \
        $([ "$mode" != bf16 ] && echo --fp8-recipe "$mode") --log "$out/fp8_conv_$mode.jsonl" > "$out/fp8_conv_$mode.log" 2>&1 ||
        { tail -5 "$out/fp8_conv_$mode.log"; echo "error: the $mode run failed"; exit 1; }
    tail -2 "$out/fp8_conv_$mode.log"
done
logs=()
for mode in "${modes[@]}"; do logs+=("$out/fp8_conv_$mode.jsonl"); done
python3 scripts/plot_log.py "${logs[@]}" --names "${modes[@]}" \
    --out "$out/fp8_convergence.png" --title "issue 15: bf16 against the FP8 recipes, 174M parameters, default corpus"
python3 - "$out" "${modes[@]}" <<'PY'
import json, statistics, sys
out, modes = sys.argv[1], sys.argv[2:]
res = {}
for mode in modes:
    recs = [json.loads(l) for l in open("%s/fp8_conv_%s.jsonl" % (out, mode)) if l.strip()]
    steps = [r for r in recs if "loss" in r]
    vals = [r for r in recs if "val_loss" in r]
    res[mode] = dict(last100_loss=statistics.mean(r["loss"] for r in steps[-100:]),
                     val_loss=vals[-1]["val_loss"] if vals else None,
                     tokens_per_s=statistics.median(r["tokens_per_s"] for r in steps[1:]))
b = res["bf16"]
worst = 0.0
for mode in modes:
    if mode == "bf16":
        continue
    f = res[mode]
    f["loss_rel_diff"] = (f["last100_loss"] - b["last100_loss"]) / b["last100_loss"]
    f["val_rel_diff"] = (f["val_loss"] - b["val_loss"]) / b["val_loss"] if b["val_loss"] else None
    f["speedup"] = f["tokens_per_s"] / b["tokens_per_s"]
    worst = max(worst, abs(f["loss_rel_diff"]))
    print("PASS" if abs(f["loss_rel_diff"]) <= 0.01 else "FAIL",
          "--fp8-recipe %s: loss within 1%% of bf16's over the last 100 steps: %+.3f%%" % (mode, 100 * f["loss_rel_diff"]))
json.dump(res, open(out + "/fp8_convergence.json", "w"), indent=1)
print(json.dumps(res))
sys.exit(0 if worst <= 0.01 else 1)
PY
