#!/usr/bin/env bash
# Bad input to the trainers' command lines: each case must exit non-zero with a
# message that names the cause. Runs ./train_llama_ref, and ./train_llama where
# it was built (all of these are caught before the GPU is touched).
set -u
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. tests/lib.sh

# A valid shard (header per docs/shard_format.md) of 5000 tokens of a 128256 vocab.
python3 tests/make_random_shard.py "$tmp/good_000000.bin" 128256 5000 1 128000 128001
head -c 3000 "$tmp/good_000000.bin" > "$tmp/cut_000000.bin"
printf 'NOTASHARD' > "$tmp/junk_000000.bin"
head -c 1000 testdata/tiny_gqa_tied.weights.llmt > "$tmp/cut.weights.llmt"
good="$tmp/good_*.bin"


for bin in ./train_llama_ref ./train_llama; do
    [ -x "$bin" ] || continue
    expect "$bin unknown flag" "--bogus" $bin --bogus 1
    expect "$bin non-numeric -B" "'x'" $bin -B x --train "$good"
    expect "$bin unknown preset" "nope" $bin --preset nope --train "$good"
    expect "$bin no shard matches" "$tmp/none_*.bin" $bin --preset nano --train "$tmp/none_*.bin"
    expect "$bin junk shard" "$tmp/junk_000000.bin" $bin --preset nano --train "$tmp/junk_*.bin"
    expect "$bin truncated shard" "$tmp/cut_000000.bin" $bin --preset nano --train "$tmp/cut_*.bin"
    expect "$bin truncated weights" "$tmp/cut.weights.llmt" $bin --init-from "$tmp/cut.weights.llmt" --train "$good"
    expect "$bin missing weights" "$tmp/missing.weights.llmt" $bin --init-from "$tmp/missing.weights.llmt" --train "$good"
    expect "$bin T over max_seq_len" "max_seq_len" $bin --preset nano -T 4096 --train "$good"
    expect "$bin shard vocab over the model's" "vocab_size 128256" \
        $bin --init-from testdata/tiny_gqa_tied.weights.llmt -T 8 -B 1 --train "$good"
    expect "$bin shard too small for the batch" "$tmp/good_000000.bin" $bin --preset nano -B 8 -T 1024 --train "$good"
    expect "$bin bad export dtype" "--export-dtype takes fp32 or bf16" $bin --preset nano --export-dtype fp16 --train "$good"
    expect "$bin unknown FP8 recipe" "unknown --fp8-recipe 'column'; use tensor, row or block" \
        $bin --preset nano --fp8-recipe column --train "$good"
    if [ "$bin" = ./train_llama_ref ] || nvidia-smi -L > /dev/null 2>&1; then # these train a step first
        expect "$bin --log on a full disk" "cannot write the log '/dev/full': No space left on device" \
            $bin --preset nano -B 1 -T 64 --steps 2 --train "$good" --val '' --log /dev/full
        # a full disk under the export: writes past a 64 KiB file-size limit fail (EFBIG, SIGXFSZ ignored), as
        # ENOSPC would
        full_disk=(bash -c 'trap "" XFSZ; ulimit -f 64; exec "$@"' full_disk)
        expect "$bin --export on a full disk" "--export: " "${full_disk[@]}" $bin --preset nano -B 1 -T 64 \
            --steps 1 --train "$good" --val '' --log '' --export "$tmp/export_full"
        check "$bin a failed --export leaves no DIR.tmp and no DIR" \
            test ! -e "$tmp/export_full.tmp" -a ! -e "$tmp/export_full"
    fi
    expect "$bin --doc-positions without --doc-mask" "--doc-positions 0 says where RoPE positions restart" \
        $bin --preset nano --doc-positions 0 --train "$good"
    expect "$bin --random-data with --train" "--random-data trains on random tokens, not on --train '$good'" \
        $bin --preset nano --random-data --train "$good"
    expect "$bin --random-data with --val" "--random-data has no val shards to evaluate" \
        $bin --preset nano --random-data --val "$good"
    expect "$bin samples without a tokenizer" "--sample-every needs the shards' tokenizer" \
        $bin --preset nano -B 1 -T 64 --sample-every 5 --train "$good" --val ''
    expect "$bin a tokenizer file that is none" "$tmp/junk_000000.bin' holds" \
        $bin --preset nano -B 1 -T 64 --tokenizer "$tmp/junk_000000.bin" --train "$good" --val ''
    expect "$bin export into a full directory" "exists and is not an empty directory" \
        $bin --preset nano --export testdata --train "$good"
    expect "$bin --init-from a directory without config.json" "$tmp/config.json" $bin --init-from "$tmp" --train "$good"
    # the audit of be39022: train_llama_ref ignored --preset and the shape flags beside --init-from
    expect "$bin --preset beside --init-from is refused" "drop --preset and the shape flags" \
        $bin --preset nano --init-from testdata/tiny_gqa_tied.weights.llmt --train "$good"
    expect "$bin a shape flag beside --init-from is refused" "drop --preset and the shape flags" \
        $bin --n-layer 3 --init-from testdata/tiny_gqa_tied.weights.llmt --train "$good"
    # every numeric flag: the range --help shows is the one enforced, at each end, before any work
    # (a value just outside each bound; for ints the first past int's range too)
    while read -r flag value range; do
        expect "$bin $flag $value is refused, naming $range" "$flag $value is out of range: it takes values in $range" \
            $bin $flag "$value" --train "$good"
    done < <($bin --help | python3 tests/flag_ranges.py)
    n_ranged=$($bin --help | python3 tests/flag_ranges.py | cut -d' ' -f1 | sort -u | wc -l)
    n_numeric=$($bin --help | grep -cE '^  (--[a-z0-9-]+|-[A-Z]) N ')
    check "$bin every one of the $n_numeric numeric flags has a range ($n_ranged)" [ "$n_ranged" -eq "$n_numeric" ]
done
# an unwritable --log is found before training, not after it
expect "train_llama_ref --doc-mask without shards" "--doc-mask finds documents at the shards' BOS token" \
    ./train_llama_ref --preset nano --random-data --doc-mask
expect "train_llama_ref an unwritable --log" "cannot create the folder of the log '/proc/nope/log.jsonl'" \
    ./train_llama_ref --preset nano -B 1 -T 64 --steps 2 --train "$good" --val '' --log /proc/nope/log.jsonl
# make CFLAGS=... used to drop the Makefile's own flags (-I., -std=gnu11) and fail to build
check "make CFLAGS=-O0 keeps the Makefile's flags" \
    bash -c "make -n -B CFLAGS=-O0 train_llama_ref | grep -q -- '-O0 -std=gnu11 -Wall -Wextra -fno-math-errno -I\.'"
# The README's claim: both trainers take the same training flags. Every flag of the CPU reference's --help is
# one of the GPU trainer's.
if [ -x ./train_llama ]; then
    missing=$(comm -23 <(./train_llama_ref --help 2>&1 | grep -oE '^  -[-A-Za-z0-9]+' | sort -u) \
                       <(./train_llama --help 2>&1 | grep -oE '^  -[-A-Za-z0-9]+' | sort -u) | tr -d ' ' | tr '\n' ' ')
    count=$(./train_llama_ref --help 2>&1 | grep -cE '^  -[-A-Za-z0-9]+')
    check "the GPU trainer takes each of the CPU reference's $count flags${missing:+ (missing: $missing)}" \
        test -z "$missing" -a "$count" -gt 40
fi

if [ -x ./train_llama ]; then
    expect "train_llama total batch not a multiple of B*T" "multiple" \
        ./train_llama --preset nano -B 2 -T 64 --total-batch 100 --train "$good"
    expect "train_llama total batch not a multiple of B*T*GPUs" "B*T*GPUs = 256" \
        ./train_llama --preset nano -B 2 -T 64 --total-batch 384 --rank 0 --world-size 2 --train "$good"
    expect "train_llama FP8 block recipe without whole 128-blocks" "--fp8-recipe block needs B*T, d_model" \
        ./train_llama --preset nano -B 2 -T 64 --fp8-recipe block --train "$good"
    expect "train_llama unknown --shard-over" "--shard-over takes world or host (got 'node')" \
        ./train_llama --preset nano --shard-over node --train "$good"
    expect "train_llama --shard-over host needs a sharding stage" "--shard-over host needs --zero-stage 1, 2 or 3" \
        ./train_llama --preset nano --shard-over host --zero-stage 0 --train "$good"
    expect "train_llama --shard-group without --shard-over host" "hint: add --shard-over host" \
        ./train_llama --preset nano --shard-group 2 --train "$good"
    expect "train_llama unknown --grad-accum" "--grad-accum takes auto, local or sharded (got 'global')" \
        ./train_llama --preset nano --grad-accum global --train "$good"
    expect "train_llama unknown --grad-reduce" "--grad-reduce takes bf16, fp32, int8 or e4m3 (got 'fp16')" \
        ./train_llama --preset nano --grad-reduce fp16 --train "$good"
    expect "train_llama quantized sums at stage 0" "--grad-reduce int8 needs --zero-stage 1, 2 or 3" \
        ./train_llama --preset nano --grad-reduce int8 --zero-stage 0 --train "$good"
    expect "train_llama unknown --weight-gather" "--weight-gather takes auto, bf16, int8 or e4m3 (got 'fp8')" \
        ./train_llama --preset nano --weight-gather fp8 --zero-stage 3 --train "$good"
    expect "train_llama quantized gathers below stage 3" "hint: add --zero-stage 3" \
        ./train_llama --preset nano --weight-gather e4m3 --zero-stage 2 --train "$good"
    expect "train_llama unknown --update-gather" "--update-gather takes bf16 or delta (got 'int8')" \
        ./train_llama --preset nano --update-gather int8 --zero-stage 1 --train "$good"
    expect "train_llama delta gather at flat stage 3" "(flat stage 3 keeps each GPU's own)" \
        ./train_llama --preset nano --update-gather delta --zero-stage 3 --train "$good"
    expect "train_llama delta gather at stage 0" "hint: use --zero-stage 1 or 2, or 3 with --shard-over host" \
        ./train_llama --preset nano --update-gather delta --zero-stage 0 --train "$good"
    expect "train_llama delta gather with the host's AdamW" "--offload optimizer runs it on the host" \
        ./train_llama --preset nano --update-gather delta --offload optimizer --train "$good"
    expect "train_llama unknown --offload" "--offload takes none or optimizer (got 'gradients')" \
        ./train_llama --preset nano --offload gradients --train "$good"
    expect "train_llama unknown --fp8-weights" "--fp8-weights takes auto or made (got 'kept')" \
        ./train_llama --preset nano --fp8 --fp8-weights kept --train "$good"
    expect "train_llama --fp8-weights without --fp8" "hint: add --fp8" \
        ./train_llama --preset nano --fp8-weights made --train "$good"
    expect "train_llama bad rendezvous spec" "tcp://HOST:PORT" \
        ./train_llama --preset nano --rendezvous "udp://x:1" --train "$good"
    expect "train_llama rank outside the world" "rank" \
        ./train_llama --preset nano --rank 2 --world-size 2 --train "$good"
    expect "train_llama RANK without WORLD_SIZE names the variable" "WORLD_SIZE" \
        env RANK=1 ./train_llama --preset nano --train "$good"
    if ! nvidia-smi -L > /dev/null 2>&1; then
        expect "train_llama without a GPU points at the CPU reference" "train_llama_ref" \
            ./train_llama --preset nano -B 1 -T 64 --train "$good" --val ''
    fi
fi
summary
