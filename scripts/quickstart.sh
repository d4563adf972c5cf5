#!/usr/bin/env bash
# The README's first command: set a fresh machine up, prepare the default
# corpus with the Llama 3 tokenizer, and train a small model on it: on the GPU
# with ./train_llama when one is present, else on the CPU with the fp32
# reference trainer ./train_llama_ref; then plots the run's log to a PNG
# beside it (scripts/plot_log.py).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# QUICKSTART_SKIP_SETUP=1 skips the installs (a machine set up already, or one without package access).
if [ -z "${QUICKSTART_SKIP_SETUP:-}" ]; then
    ./scripts/setup.sh
fi
py=$(test -x .venv/bin/python3 && echo .venv/bin/python3 || echo python3)
if ! ls data/shards/corpus_train_*.bin > /dev/null 2>&1; then
    "$py" data/prepare.py
fi

log=""
prev=""
for arg in "$@"; do # the log the trainer writes: --log X among the arguments, else its default
    [ "$prev" = "--log" ] && log=$arg
    prev=$arg
done
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > /dev/null 2>&1 && command -v nvcc > /dev/null 2>&1; then
    log=${log:-log/train_llama.jsonl}
    echo "GPU found: training the 'tiny' preset with ./train_llama"
    make -j2 train_llama
    ./train_llama --train 'data/shards/corpus_train_*.bin' --val 'data/shards/corpus_val_*.bin' \
        --preset tiny -B 8 -T 512 --steps 200 --lr 1e-3 --warmup 20 --eval-every 50 "$@"
else
    log=${log:-log/train_llama_ref.jsonl}
    echo "no GPU here: training the 'nano' preset with the CPU reference ./train_llama_ref"
    echo "(on a machine with an NVIDIA GPU this script trains with ./train_llama instead)"
    make train_llama_ref
    ./train_llama_ref --train 'data/shards/corpus_train_*.bin' --val 'data/shards/corpus_val_*.bin' \
        --preset nano -B 4 -T 64 --steps 60 --lr 3e-3 --warmup 5 --eval-every 20 "$@"
fi
if [ -n "$log" ] && [ -s "$log" ]; then
    "$py" scripts/plot_log.py "$log" && echo "look at the run: ${log%.*}.png"
fi
