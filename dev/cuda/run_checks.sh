#!/usr/bin/env bash
# Build and run every kernel check in dev/cuda (needs an sm_90 GPU, i.e. an H100),
# then print a summary table: per program its exit status and PASS/FAIL counts,
# then every FAIL line and every timing line. Exits non-zero if a build or any
# check fails. Arguments go to every program (e.g. --seed 1234 to replay a run).
# Logs and the summary go to $CHECK_LOG_DIR (default: $OUT/cuda_checks if $OUT is
# set, else /tmp/llmc_cuda_checks). CHECKS="..." names a subset to run.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log_dir="${CHECK_LOG_DIR:-${OUT:+$OUT/cuda_checks}}"
log_dir="${log_dir:-/tmp/llmc_cuda_checks}"
mkdir -p "$log_dir"
checks=(rmsnorm_check rope_check swiglu_check embedding_check adamw_check bias_check qk_norm_check block_codec_check delta_codec_check)
checks+=(matmul_check attention_check fused_classifier_check fp8_matmul_check)
# CHECKS="a_check b_check" runs those alone (all of them take over 400 s on an H100)
[ -n "${CHECKS:-}" ] && read -r -a checks <<< "$CHECKS"

if ! make -C "$here" -j4 all > "$log_dir/build.log" 2>&1; then
    cat "$log_dir/build.log"
    echo "FAIL: build of dev/cuda checks failed (log: $log_dir/build.log)"
    exit 1
fi

status=0
for c in "${checks[@]}"; do
    echo "=== $c"
    "$here/$c" "$@" 2>&1 | tee "$log_dir/$c.log"
    rc=${PIPESTATUS[0]}
    echo "$rc" > "$log_dir/$c.rc"
    [ "$rc" -ne 0 ] && status=1
done

summary="$log_dir/summary.txt"
{
    printf '%-18s %4s %6s %6s\n' check rc pass fail
    for c in "${checks[@]}"; do
        printf '%-18s %4s %6s %6s\n' "$c" "$(cat "$log_dir/$c.rc")" \
            "$(grep -c '^PASS' "$log_dir/$c.log")" "$(grep -c '^FAIL' "$log_dir/$c.log")"
    done
    echo
    grep -h '^FAIL' "$log_dir"/*_check.log
    grep -h '^BENCH' "$log_dir"/*_check.log
    echo
    [ "$status" -eq 0 ] && echo "ALL CHECKS PASSED" || echo "SOME CHECKS FAILED"
} > "$summary"
echo
echo "=== summary (also in $summary)"
cat "$summary"
exit "$status"
