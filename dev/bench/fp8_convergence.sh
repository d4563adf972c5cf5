#!/usr/bin/env bash
# Issue #15's convergence check on the GPU (dev/bench/convergence.sh: its model, data and schedule): bf16 and
# each FP8 scaling recipe (--fp8-recipe tensor, row, block) on one GPU, each FP8 run's mean train loss over the
# last 100 steps within 1% of the bf16 run's (set in issue 15: FP8's rounding of every GEMM operand moves a loss
# of ~3.3 by well under that when the recipe is sound). Writes $OUT/fp8_conv_MODE.jsonl per run, the plot
# $OUT/fp8_convergence.png and $OUT/fp8_convergence.json.
# Usage: dev/bench/fp8_convergence.sh [STEPS [MODE...]]   (about 90 s a run on an H100)
set -u
cd "$(dirname "$0")/../.." || exit 1
steps="${1:-1000}"
shift $(($# > 0 ? 1 : 0))
modes=(tensor row block)
[ $# -gt 0 ] && modes=("$@")
variants=("bf16=")
for mode in "${modes[@]}"; do
    [ "$mode" = bf16 ] || variants+=("$mode=--fp8-recipe $mode")
done
SUMMARY=fp8_convergence TITLE="issue 15: bf16 against the FP8 recipes, 174M parameters, default corpus" \
    exec dev/bench/convergence.sh fp8_conv "$steps" 0.01 - "${variants[@]}"
