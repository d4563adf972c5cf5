#!/usr/bin/env bash
# The CPU tests (their names are the arguments) and a short train, checkpoint
# and resume of train_llama_ref, each built with AddressSanitizer and
# UndefinedBehaviorSanitizer in $SANITIZE_DIR (make test-sanitize builds them):
# a memory error, a leak or undefined behaviour fails the run.
set -u
cd "$(dirname "$0")/.."
dir="${SANITIZE_DIR:-build/sanitize}"
# halt_on_error: the first report ends the program with a non-zero status
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0:exitcode=66"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=67"
. tests/lib.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for t in "$@"; do
    start=$(date +%s)
    if "$dir/$t" > "$tmp/log" 2>&1; then
        ok "$t under ASan + UBSan ($(grep -Eo '[0-9]+ passed, [0-9]+ failed' "$tmp/log" | tail -1), $(($(date +%s) - start)) s)"
    else
        bad "$t under ASan + UBSan (exit $?):"
        grep -E "ERROR|SUMMARY|runtime error|FAIL" "$tmp/log" | head -10 | sed 's/^/    /'
    fi
done

# the trainer end to end: shards, 4 steps with a checkpoint at 2 and the end, a resume, an export
"${PYTHON:-python3}" tests/make_random_shard.py "$tmp/d_train_000000.bin" 512 20000 1 0 1
"${PYTHON:-python3}" tests/make_random_shard.py "$tmp/d_val_000000.bin" 512 4000 2 0 1
args=(--preset nano --vocab 512 -B 2 -T 32 --steps 4 --eval-every 2 --eval-batches 2 --train "$tmp/d_train_*.bin"
      --val "$tmp/d_val_*.bin" --checkpoint-dir "$tmp/ck" --save-every 2 --log "$tmp/log.jsonl")
if "$dir/train_llama_ref" "${args[@]}" --steps 2 > "$tmp/log" 2>&1 &&
    "$dir/train_llama_ref" "${args[@]}" --resume --export "$tmp/hf" >> "$tmp/log" 2>&1; then
    ok "train_llama_ref under ASan + UBSan: 2 steps, checkpoint, resume to 4, export"
else
    bad "train_llama_ref under ASan + UBSan (exit $?):"
    grep -E "ERROR|SUMMARY|runtime error|error" "$tmp/log" | head -10 | sed 's/^/    /'
fi
summary
