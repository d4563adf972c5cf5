#!/usr/bin/env bash
# On the GPU machine (torch and transformers installed; data/shards of the default corpus carried along): HF
# model directories in and out of train_llama (issue #12). Logs under $OUT/hf (or /tmp/hf_check).
#   1. models by transformers' save_pretrained (bf16; Llama tied in one file, untied in 20 MB shards; Qwen2 with
#      q, k, v biases, Qwen3 with q/k norms, Mistral; shapes unlike the presets) train 20 steps from --init-from on one window of real text; their first-step loss against
#      transformers'; a bf16 export and the fp32 checkpoint load with from_pretrained, logits within bf16
#      tolerance; test_llama checks train_llama's forward, backward and steps against the trained checkpoint as
#      transformers computes it (a dump made by reference/make_reference.py --from-hf)
#   2. a tiny model trained on the default corpus: its greedy sample against transformers' generate
#   3. Llama 3.2 1B from an HF directory trains at the tokens/s it trains at from --preset
# Usage: scripts/hf_check.sh [build] [models] [greedy] [speed]     (default: all)
#   HF_MODELS="qwen3 mistral" limits the models step to those (hf_check.py names lists them)
set -u
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/hf_check}/hf"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
steps="${*:-build models greedy speed}"
tok=data/shards/corpus_tokenizer.model
status=0
for s in $steps; do
    case "$s" in
    build)
        make -j"$(nproc)" gpu > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; echo "FAIL build"; exit 1; };;
    models)
        python3 scripts/hf_check.py make "$out" || status=1
        for m in $(python3 scripts/hf_check.py names); do
            rm -rf "$out/ck_$m" "$out/exp_$m"
            ./train_llama --init-from "$out/hf_$m" --train "$out/window_train_*.bin" --val '' --tokenizer "$tok" \
                -B 2 -T 256 --steps 20 --warmup 0 --lr 1e-4 --schedule constant --checkpoint-dir "$out/ck_$m" \
                --keep 1 --export "$out/exp_$m" --export-dtype bf16 --log "$out/train_$m.jsonl" \
                > "$out/train_$m.log" 2>&1 || { tail -5 "$out/train_$m.log"; echo "FAIL train_llama from hf_$m"; status=1; }
            python3 reference/make_reference.py --from-hf "$out/ck_$m/step_00000020" --name "final_$m" \
                --shard "$out/window_train_000000.bin" -B 2 -T 64 --lr 1e-4 --out-dir "$out" > "$out/dump_$m.log" 2>&1 ||
                { tail -5 "$out/dump_$m.log"; status=1; }
            ./test_llama "$out/final_$m.dump.llmt" > "$out/test_final_$m.log" 2>&1 || status=1
            echo "test_llama against the trained $m model as transformers computes it:" \
                "$(grep -E 'max relative|passed' "$out/test_final_$m.log" | tr '\n' ' ')"
            grep '^FAIL' "$out/test_final_$m.log"
        done
        python3 scripts/hf_check.py compare "$out" || status=1;;
    greedy)
        rm -rf "$out/tiny"
        ./train_llama --preset tiny -B 8 -T 512 --steps 300 --lr 1e-3 --warmup 20 --eval-every 0 --export "$out/tiny" \
            --sample-every 300 --temperature 0 --sample-tokens 20 --log "$out/tiny.jsonl" > "$out/tiny.log" 2>&1 ||
            { tail -5 "$out/tiny.log"; status=1; }
        grep -E "^step +300/" "$out/tiny.log"
        python3 scripts/hf_check.py greedy "$out" || status=1;;
    speed)
        rm -rf "$out/hf1b"
        ./train_llama --preset llama3.2-1b --random-data -B 1 -T 128 --steps 1 --log '' --export "$out/hf1b" \
            --export-dtype bf16 > "$out/hf1b.log" 2>&1 || { tail -5 "$out/hf1b.log"; status=1; }
        for ((round = 1; round <= ${SPEED_ROUNDS:-2}; round++)); do
            for src in preset hf; do
                model=(--preset llama3.2-1b)
                [ $src = hf ] && model=(--init-from "$out/hf1b")
                ./train_llama "${model[@]}" --random-data -B 8 -T 2048 --steps 12 --warmup 2 \
                    --log "$out/speed_${src}_$round.jsonl" > "$out/speed_${src}_$round.log" 2>&1 || status=1
                echo "$src, round $round: $(grep 'mean after the first step' "$out/speed_${src}_$round.log")"
            done
        done;;
    *)
        echo "unknown step '$s' (build, models, greedy, speed)"; status=1;;
    esac
done
exit $status
