#!/usr/bin/env bash
# Fuzzes every reader of outside files (a tests/fuzz/fuzz_NAME.c each): builds each with
# clang's libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer, and runs
# it for FUZZ_SECONDS (default 20) on its committed seed corpus
# tests/fuzz/corpus/NAME (which also keeps every input that once crashed, as a
# regression input) plus what earlier runs found (build/fuzz/corpus_NAME).
# A crash, leak or sanitizer report fails the run; the input lands in
# build/fuzz/ (libFuzzer names it crash-*, leak-*, ...). Prints the number of
# inputs each target ran.
#   tests/fuzz/run.sh [NAME ...]          (default: every target)
set -u
cd "$(dirname "$0")/../.."
seconds="${FUZZ_SECONDS:-20}"
CC_FUZZ="${CC_FUZZ:-clang}"
if ! command -v "$CC_FUZZ" > /dev/null; then
    echo "FAIL fuzz: no $CC_FUZZ (libFuzzer needs clang; ./scripts/setup.sh installs it)"
    exit 1
fi
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for f in tests/fuzz/fuzz_*.c; do names+=("$(basename "$f" .c | sed 's/^fuzz_//')"); done
fi
mkdir -p build/fuzz
status=0
for name in "${names[@]}"; do
    bin=build/fuzz/fuzz_$name
    if ! "$CC_FUZZ" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. \
        "tests/fuzz/fuzz_$name.c" -o "$bin"; then
        echo "FAIL fuzz_$name: does not build"
        status=1
        continue
    fi
    mkdir -p "build/fuzz/corpus_$name"
    log=build/fuzz/fuzz_$name.log
    (cd build/fuzz && "./fuzz_$name" -max_total_time="$seconds" -print_final_stats=1 \
        "corpus_$name" "../../tests/fuzz/corpus/$name") > "$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    if [ $rc -eq 0 ]; then
        echo "PASS fuzz_$name: ${runs:-?} inputs in ${seconds} s, no crash"
    else
        echo "FAIL fuzz_$name (exit $rc): see $log"
        grep -E "ERROR|SUMMARY|fuzz_[a-z_]*:|Test unit written" "$log" | head -8 | sed 's/^/    /'
        status=1
    fi
done
exit $status
