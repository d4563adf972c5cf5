#!/usr/bin/env bash
# The README's fine-tuning recipe, end to end on one GPU (~2 minutes on an H100):
#   1. a base model: the 'small' preset widened to d_model 768 (174M parameters), trained on the default corpus,
#      exported as an HF directory (runs/faq/base);
#   2. the data: question/answer pairs from the Python FAQ in Debian's python3-doc (data/faq_pairs.py), made
#      into shards with a loss mask (data/prepare.py --format pairs): the loss counts the answers only;
#   3. the fine-tune: --init-from the base, on the pairs; greedy answers to a held-out question from the base
#      (its last sample) and from the fine-tuned model, the log plotted to log/finetune_faq.png.
# Writes runs/faq/ and data/shards/faq_*; the base is reused when runs/faq/base exists.
# Usage: scripts/finetune_faq.sh [BASE_STEPS] [FINETUNE_STEPS]      (defaults 1000 and 100)
set -euo pipefail
cd "$(dirname "$0")/.."
base_steps=${1:-1000}
ft_steps=${2:-100}
py=$(test -x .venv/bin/python3 && echo .venv/bin/python3 || echo python3)
model=(--preset small --d-model 768 --n-layer 12 --n-head 12 --n-kv-head 4 --ffn-dim 2048)
mkdir -p runs/faq log

if [ ! -f data/shards/faq_train_000000.bin ]; then
    "$py" data/faq_pairs.py > runs/faq/all.jsonl
    # 175 pairs, ~30K tokens: the last 5 held out for the samples, a tenth of the rest for val
    head -n -5 runs/faq/all.jsonl > runs/faq/faq.jsonl
    tail -n 5 runs/faq/all.jsonl > runs/faq/heldout.jsonl
    "$py" data/prepare.py --format pairs runs/faq/faq.jsonl --name faq --val-tokens 3000
fi
ls data/shards/corpus_train_*.bin > /dev/null 2>&1 || "$py" data/prepare.py

# the first held-out question (never trained on), in the trained format: "Q: question?\nA:"
question=$("$py" -c 'import json, sys; print(json.loads(open(sys.argv[1]).readline())["prompt"])' runs/faq/heldout.jsonl)
if [ ! -f runs/faq/base/config.json ]; then
    echo "== 1. the base model: $base_steps steps on the default corpus"
    ./train_llama "${model[@]}" --train 'data/shards/corpus_train_*.bin' --val 'data/shards/corpus_val_*.bin' \
        -B 16 -T 1024 --steps "$base_steps" --lr 6e-4 --warmup 100 --eval-every 250 --log log/faq_base.jsonl \
        --sample-every "$base_steps" --sample-tokens 80 --temperature 0 --prompt "$question" \
        --export runs/faq/base | grep -vE "^step +[0-9]+/"
fi

echo "== 2. fine-tuning on $(wc -l < runs/faq/faq.jsonl) question/answer pairs; held-out question: ${question//$'\n'/ }"
echo "(the base model's answer is its sample above; the fine-tuned model's is the sample below)"
./train_llama --init-from runs/faq/base --train 'data/shards/faq_train_*.bin' --val 'data/shards/faq_val_*.bin' \
    -B 4 -T 512 --steps "$ft_steps" --lr 1e-4 --warmup 10 --eval-every 25 --log log/finetune_faq.jsonl \
    --sample-every "$ft_steps" --sample-tokens 80 --temperature 0 --prompt "$question" \
    --export runs/faq/finetuned
"$py" scripts/plot_log.py log/faq_base.jsonl log/finetune_faq.jsonl --names base finetune \
    --out log/finetune_faq.png --title "fine-tuning on the Python FAQ (loss on the answers only)" || true
