#!/usr/bin/env bash
# A convergence comparison on the GPU: the same model, data, seed and batch order trained once per variant (a
# name and the train_llama flags that make it), each variant's loss to stay within a tolerance of the first
# variant's, the baseline. Model: the 'small' preset widened to d_model 768, 12 layers, 12 heads (4 key/value),
# ffn 2048, the Llama 3 vocabulary tied: 174M parameters. Data: the default corpus (data/shards, carried to the
# GPU machine), B=16 per GPU (B=... to change it), T=1024, AdamW lr 6e-4 (cosine, 100 warm-up), val loss every 100 steps.
#
#   dev/bench/convergence.sh TAG STEPS TOL VAL_TOL NAME=FLAGS [NAME=FLAGS ...]
#
# TOL: the largest relative difference of the mean train loss over the last 100 steps; VAL_TOL: of the last
# val loss ('-': not checked). LAUNCH="..." goes before ./train_llama (e.g. an mpirun line for several GPUs);
# DATA=DIR takes the corpus_{train,val}_*.bin shards from DIR instead of data/shards.
# Writes $OUT/TAG_NAME.jsonl and .log per run, the plot $OUT/SUMMARY.png (scripts/plot_log.py) and
# $OUT/SUMMARY.json (SUMMARY defaults to TAG): each run's mean train loss over the last 100 steps, last val
# loss and median tokens/s, and each variant's relative differences from the baseline. TITLE names the plot.
# Users: dev/bench/fp8_convergence.sh (issue 15), scripts/multi_gpu_check.sh qconvergence (issue 29).
set -u
cd "$(dirname "$0")/../.." || exit 1
if [ $# -lt 5 ]; then
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
tag=$1 steps=$2 tol=$3 val_tol=$4
shift 4
out="${OUT:-.}"
summary="${SUMMARY:-$tag}"
mkdir -p "$out"
data="${DATA:-data/shards}"
ls "$data"/corpus_train_*.bin > /dev/null 2>&1 || { echo "error: no $data/corpus_train_*.bin (data/prepare.py makes them)"; exit 1; }
read -r -a launch <<< "${LAUNCH:-}"
model=(--preset small --d-model 768 --n-layer 12 --n-head 12 --n-kv-head 4 --ffn-dim 2048)
names=()
for variant in "$@"; do
    name=${variant%%=*}
    [ "$name" != "$variant" ] || { echo "error: '$variant' is not NAME=FLAGS"; exit 2; }
    read -r -a flags <<< "${variant#*=}"
    names+=("$name")
    timeout 900 "${launch[@]}" ./train_llama "${model[@]}" --train "$data/corpus_train_*.bin" \
        --val "$data/corpus_val_*.bin" -B "${B:-16}" -T 1024 --steps "$steps" --lr 6e-4 --warmup 100 --eval-every 100 \
        --seed 1337 "${flags[@]}" --log "$out/${tag}_$name.jsonl" > "$out/${tag}_$name.log" 2>&1 ||
        { tail -5 "$out/${tag}_$name.log"; echo "error: the $name run failed"; exit 1; }
    tail -2 "$out/${tag}_$name.log"
done
logs=()
for name in "${names[@]}"; do logs+=("$out/${tag}_$name.jsonl"); done
python3 scripts/plot_log.py "${logs[@]}" --names "${names[@]}" --out "$out/$summary.png" --title "${TITLE:-$tag}"
python3 - "$out" "$tag" "$summary" "$tol" "$val_tol" "${names[@]}" << 'PY'
import json, statistics, sys
out, tag, summary, tol, val_tol, names = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5], sys.argv[6:]
val_tol = None if val_tol == "-" else float(val_tol)
res = {}
for name in names:
    recs = [json.loads(l) for l in open("%s/%s_%s.jsonl" % (out, tag, name)) if l.strip()]
    steps = [r for r in recs if "loss" in r]
    vals = [r for r in recs if "val_loss" in r]
    res[name] = dict(last100_loss=statistics.mean(r["loss"] for r in steps[-100:]),
                     val_loss=vals[-1]["val_loss"] if vals else None,
                     tokens_per_s=statistics.median(r["tokens_per_s"] for r in steps[1:]))
base = res[names[0]]
bad = 0
for name in names[1:]:
    f = res[name]
    f["loss_rel_diff"] = (f["last100_loss"] - base["last100_loss"]) / base["last100_loss"]
    f["val_rel_diff"] = (f["val_loss"] - base["val_loss"]) / base["val_loss"] if base["val_loss"] else None
    f["speedup"] = f["tokens_per_s"] / base["tokens_per_s"]
    ok = abs(f["loss_rel_diff"]) <= tol
    print("PASS" if ok else "FAIL", "%s: train loss within %g%% of %s's over the last 100 steps: %+.3f%%"
          % (name, 100 * tol, names[0], 100 * f["loss_rel_diff"]))
    bad += not ok
    if val_tol is not None:
        ok = f["val_rel_diff"] is not None and abs(f["val_rel_diff"]) <= val_tol
        print("PASS" if ok else "FAIL", "%s: last val loss within %g%% of %s's: %s"
              % (name, 100 * val_tol, names[0],
                 "none" if f["val_rel_diff"] is None else "%+.3f%%" % (100 * f["val_rel_diff"])))
        bad += not ok
json.dump(res, open("%s/%s.json" % (out, summary), "w"), indent=1)
print(json.dumps(res))
sys.exit(1 if bad else 0)
PY
