#!/usr/bin/env bash
# On the GPU machine: build the CUDA programs, run test_llama against the
# reference dumps, run every dev/cuda kernel check, and time a few training
# steps of the Llama 3.2 1B shape. Logs go to $OUT (or /tmp/gpu_check).
# Usage: scripts/gpu_check.sh [build] [test] [pytest] [train] [kernels] [bench] [attention] [memory] [settings] [longest] [level3] [bestb] [long8b] [offload8b] [qwen] [qwenllmq] [cut8b] [clocks] [autotune] [profile] [robust]
#   (default: build test train kernels bench; train needs data/shards carried along)
set -u
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/gpu_check}"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
steps="${*:-build test train kernels bench}"
status=0
# llmq_breakdown NAME SEQ BATCH ACCUM MODEL-ARGS...: llmq (.carry/llmq, scripts/build_llmq.sh) at its benchmark's
# bf16 settings for 8 steps on random tokens of the model scripts/llmq_inputs.py makes from MODEL-ARGS, with its
# own --debug-time-breakdown, into $out/NAME.log (its last 30 lines shown)
llmq_breakdown() {
    local name=$1 seq=$2 batch=$3 accum=$4 d=/tmp/$1
    shift 4
    python3 scripts/llmq_inputs.py "$d" "$@" --random-tokens 4194304 > /dev/null || status=1
    timeout 200 .carry/llmq/bin/train --model="$d/model" --from-scratch --train-file="$d/train.bin" \
        --eval-file="$d/eval.bin" --seq-length="$seq" --batch-size="$batch" --grad-accumulation="$accum" --steps=8 \
        --gpus=1 --model-dtype=bf16 --opt-m-dtype=bf16 --opt-v-dtype=bf16 --eval-every-n-steps=1000000 \
        --ckpt-interval=1000000 --out-dir="$d/out" --use-cuda-graphs --matmul-dtype=bf16 --lmhead-chunks=4 \
        --debug-time-breakdown --log-file="$d/bf16.json" > "$out/$name.log" 2>&1 || status=1
    grep -v "^\s*$" "$out/$name.log" | tail -30
}
# step_line NAME LOG.jsonl [PROFILED_STEP]: one line of a run's median step after the first (the profiled step left
# out: its events slow it), its tokens/s and memory, so that the numbers reach the output even where the
# machine's files do not come back
step_line() {
    python3 - "$@" << 'EOF'
import json, statistics, sys
name, log = sys.argv[1], sys.argv[2]
skip = int(sys.argv[3]) if len(sys.argv) > 3 else -1
try:
    recs = [r for r in map(json.loads, open(log)) if "loss" in r and "ms" in r]
except (OSError, ValueError) as e:
    sys.exit(f"{name}: no step records ({e})")
timed = [r for r in recs[1:] if r["step"] != skip]
if not timed:
    sys.exit(f"{name}: no timed steps")
ms = statistics.median(r["ms"] for r in timed)
print(f"{name}: median step {ms:.1f} ms of {len(timed)} ({statistics.median(r['tokens_per_s'] for r in timed):.0f} "
      f"tokens/s), peak {max(r['peak_mem_gib'] for r in recs):.2f} GiB, device {max(r['device_mem_gib'] for r in recs):.2f} GiB")
EOF
}
for s in $steps; do
    case "$s" in
    build)
        bash scripts/device_facts.sh 2>&1 | tee "$out/facts.log"
        echo "cudnn.h used: $(echo '#include <cudnn.h>' | g++ -E -x c++ -I/usr/local/cuda/include - 2>/dev/null | grep -m1 -o '/[^"]*cudnn.h')"
        make -j16 gpu > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; echo "FAIL build"; exit 1; }
        echo "build ok";;
    test)
        timeout 300 ./test_llama > "$out/test_llama.log" 2>&1; rc=$?
        grep -E "FAIL|max relative|passed|step [0-9]:|error" "$out/test_llama.log" | head -60
        [ $rc -ne 0 ] && status=1;;
    pytest)
        # the tests that need the GPU trainer: the same flags through both trainers, the --on-nan policies
        # and the non-finite init refusal, windows without targets
        timeout 400 python3 -m pytest -q tests/test_both_trainers.py tests/test_on_nan.py tests/test_no_targets.py tests/test_offload.py \
            > "$out/pytest_gpu.log" 2>&1 || status=1
        grep -E "passed|failed|error" "$out/pytest_gpu.log" | tail -8;;
    kernels)
        CHECK_LOG_DIR="$out/cuda_checks" timeout 400 bash dev/cuda/run_checks.sh > "$out/kernels.log" 2>&1 || status=1
        sed -n '/=== summary/,$p' "$out/kernels.log" | head -60;;
    train)
        QUICKSTART_SKIP_SETUP=1 timeout 300 bash scripts/quickstart.sh --log "$out/quickstart.jsonl" > "$out/quickstart.log" 2>&1 || status=1
        grep -E "val loss|^step +(1|50|100|150|200)/|error" "$out/quickstart.log" | head -20;;
    robust)
        # the kill loop on train_llama (startup takes seconds here, so fewer kills), --on-nan, and
        # compute-sanitizer on test_llama (memcheck with the leak check, racecheck)
        timeout 400 python3 tests/kill_loop.py --bin ./train_llama --kills 10 --steps 300 -- --preset tiny \
            --vocab 512 -B 4 -T 128 2>&1 | tee "$out/kill_loop.log" | tail -3
        grep -q "^PASS kill loop" "$out/kill_loop.log" || status=1
        timeout 120 python3 -m pytest -q tests/test_on_nan.py > "$out/on_nan.log" 2>&1 || status=1
        tail -1 "$out/on_nan.log"
        # memcheck with the leak check, then racecheck with every hazard printed. racecheck reports hazards in
        # NVIDIA's closed library kernels only (cuDNN's generated sm90 SDPA, cuBLAS's nvjet GEMMs: wgmma/TMA code,
        # on which the tool is known to misreport; excluding them by name crashed the tool): 1,308 on test_llama
        # and 102 on the training run at 1794af7, while their results are bit-identical run to run (test_llama,
        # the kill loop). So racecheck fails here on a hazard in any other kernel: the project's own.
        for tool in "memcheck --leak-check full --error-exitcode 9" "racecheck --print-limit 0"; do
            name=${tool%% *}
            timeout 600 compute-sanitizer --tool $tool ./test_llama testdata/tiny_gqa_tied.dump.llmt \
                > "$out/sanitizer_$name.log" 2>&1 || status=1
            # and a short training run: data loading, optimizer, checkpoint save on the device
            timeout 600 compute-sanitizer --tool $tool ./train_llama --preset tiny --vocab 512 -B 2 -T 64 --steps 3 \
                --warmup 1 --random-data --checkpoint-dir "$out/sanitizer_ckpt_$name" --save-every 3 \
                > "$out/sanitizer_train_$name.log" 2>&1 || status=1
            for log in "$out/sanitizer_$name.log" "$out/sanitizer_train_$name.log"; do
                grep -E "ERROR SUMMARY|LEAK SUMMARY|RACECHECK SUMMARY|passed|^error" "$log" | tail -3
                own=$(grep "access at" "$log" | grep -cvE "access at (cudnn_generated|nvjet)")
                echo "hazards in the project's kernels: $own"
                [ "$own" -eq 0 ] || status=1
            done
        done;;
    attention)
        # cuDNN SDPA at issue 14's shapes with the system cuDNN and with
        # the newer one beside torch (same binary: the frontend is header-only, libcudnn is loaded at run time)
        make -C dev/cuda attention_check > "$out/attention_build.log" 2>&1 || { tail -20 "$out/attention_build.log"; status=1; }
        newer=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/cudnn/lib 2> /dev/null | head -1)
        for lib in system ${newer:+"$newer"}; do
            name=$([ "$lib" = system ] && echo system || echo torch)
            LD_LIBRARY_PATH=$([ "$lib" = system ] || echo "$lib") timeout 280 ./dev/cuda/attention_check --sweep \
                > "$out/attention_sweep_$name.log" 2>&1 || status=1
            grep -E "^cuDNN|^BENCH|^FAIL" "$out/attention_sweep_$name.log"
        done
        # the same shapes through torch's SDPA backends (FlashAttention-2, memory-efficient, cuDNN; FA3 if present)
        timeout 200 python3 dev/cuda/attention_torch.py --out "$out/attention_torch.jsonl" \
            > "$out/attention_torch.log" 2>&1 || status=1
        grep -E "^torch|^BENCH|^fa3|rror" "$out/attention_torch.log";;
    memory)
        # issue 14's activation memory: the peak at B=1 and B=4, T=2048, per recompute level and for HF + Liger
        # (needs .whl/ carried along); the memory each extra sequence adds is the activations'
        OUT="$out" timeout 500 bash dev/bench/run_all.sh memory > "$out/memory.log" 2>&1 || status=1
        grep -E "^  *llama3.2-1b|train_llama|hf_liger" "$out/memory.log" | tail -14;;
    settings)
        OUT="$out" bash dev/bench/train_llama_settings.sh throughput || status=1;;
    longest)
        OUT="$out" bash dev/bench/train_llama_settings.sh longest || status=1;;
    level3|bestb|long8b|offload8b)
        OUT="$out" bash dev/bench/train_llama_settings.sh "$s" || status=1;;
    profile)
        for B in 4 8; do
            timeout 200 ./train_llama --preset llama3.2-1b --random-data -B $B -T 2048 --steps 8 --warmup 1 \
                --profile-step 6 --log "$out/profile_B$B.jsonl" > "$out/profile_B$B.log" 2>&1 || status=1
            sed -n '/profile of step/,/idle/p' "$out/profile_B$B.log"
            step_line "profile_B$B" "$out/profile_B$B.jsonl" 6 || status=1
        done;;
    qwen)
        # issue 33: where Qwen2.5-1.5B's micro-step goes at 16 x 1024 (llmq's setting), train_llama at recompute 0
        # and 1 (--profile-step) against llmq's own breakdown (--debug-time-breakdown), both at 4 micro-steps a
        # step and profiled after some 7 s of load: the benches' sustained steps ran 4% slower than a profile of
        # the first second had said (docs/performance.md, issue 33 round 3)
        for run in r0 r1 r1_fp8; do # and --fp8 (68.3k against llmq's published 73k)
            r=${run:1:1}
            timeout 200 ./train_llama --preset qwen2.5-1.5b --random-data -B 16 -T 1024 --total-batch 65536 --steps 8 \
                --warmup 1 --recompute $r --profile-step 7 $([ "$run" = r1_fp8 ] && echo --fp8) \
                --log "$out/qwen_$run.jsonl" > "$out/qwen_$run.log" 2>&1 || status=1
            sed -n '/profile of step/,/idle/p' "$out/qwen_$run.log"
            step_line "qwen_$run" "$out/qwen_$run.jsonl" 7 || status=1
        done
        llmq_breakdown llmq_bf16 1024 16 4 --model qwen2.5-1.5b;;
    qwenllmq)
        # issue 33: Qwen2.5-1.5B at llmq's own benchmark setting (its README: 32 x 1024, 16 micro-steps, 524,288
        # tokens a step; carry .carry/llmq), and at T = 2048 (16 x 2048, 16 micro-steps): llmq bf16 and train_llama
        # bf16 and --fp8 at recompute 1, then train_llama at recompute 0 (llmq recomputes nothing at its flags) at
        # 24 x 1024 / 12 x 2048 and 20 micro-steps, the most rows that fit under llmq's memory. One bench_e2e run
        # each, records in $out/e2e.jsonl (no series: they re-measure whole rows of the tables, as round 8's did);
        # the logs and llmq's inputs (about 40 MB) stay in /tmp, out of what comes back. QWENLLMQ_T="1024" runs one
        # of the two.
        for t in ${QWENLLMQ_T:-1024 2048}; do
            b=$((32768 / t))
            for spec in "llmq train_llama train_llama_fp8:1:$b:16" "train_llama:0:$((b * 3 / 4)):20"; do
                IFS=: read -r systems r bs accum <<< "$spec"
                timeout 400 python3 dev/bench/bench_e2e.py --models qwen2.5-1.5b --systems $systems --seq-lens \
                    --batch-t "$t" --batch-sweep "$bs" --grad-accum "$accum" --train-llama-recompute "$r" --steps 5 \
                    --warmup 1 --llmq .carry/llmq --out "$out/e2e.jsonl" \
                    --logs-dir "/tmp/qwenllmq_T$t" 2>&1 | grep -E "^ *[0-9]+ x|^run " || status=1
            done
        done;;
    cut8b)
        # issue 30: where the 8B cut to 8 layers (8 x 2048, one micro-step) spends its step, train_llama
        # (--profile-step) against llmq (--debug-time-breakdown), which is ahead of it there in bf16
        timeout 200 ./train_llama --preset llama3.1-8b --n-layer 8 --random-data -B 8 -T 2048 --steps 8 --warmup 1 \
            --profile-step 6 --log "$out/cut8b_train_llama.jsonl" > "$out/cut8b_train_llama.log" 2>&1 || status=1
        sed -n '/profile of step/,/idle/p' "$out/cut8b_train_llama.log"
        step_line cut8b_train_llama "$out/cut8b_train_llama.jsonl" 6 || status=1
        llmq_breakdown cut8b_llmq 2048 8 1 --model llama3.1-8b --layers 8;;
    clocks)
        # a step ~15 ms slower about once a second, on the wall clock (docs/performance.md, issue 30): the 1B's
        # step times beside the GPU's SM clock, power and clock-event reasons, sampled every 50 ms
        nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
            --format=csv,noheader,nounits -lms 50 > "$out/clocks.csv" 2>&1 &
        smi=$!
        timeout 200 ./train_llama --preset llama3.2-1b --random-data -B 8 -T 2048 --steps 40 \
            --log "$out/clocks_1b.jsonl" > "$out/clocks_1b.log" 2>&1 || status=1
        kill $smi
        python3 - "$out/clocks_1b.jsonl" "$out/clocks.csv" << 'EOF'
import collections, json, statistics, sys
ms = [json.loads(l)["ms"] for l in open(sys.argv[1]) if '"loss"' in l][1:]
med = statistics.median(ms)
print("steps after the first: median %.1f ms; slower than the median by 5%%+: %s" % (
    med, [i + 2 for i, m in enumerate(ms) if m > 1.05 * med]))
rows = [[f.strip() for f in l.split(",")] for l in open(sys.argv[2]) if l.count(",") >= 4]
busy = [r for r in rows if float(r[2]) > 300]  # samples while training (power above 300 W)
if busy:
    sm = [float(r[1]) for r in busy]
    print("while busy (%d samples): SM clock %d-%d MHz (median %d), power %.0f-%.0f W" % (
        len(busy), min(sm), max(sm), statistics.median(sm), min(float(r[2]) for r in busy),
        max(float(r[2]) for r in busy)))
    print("clock-event reasons:", dict(collections.Counter(r[4] for r in busy)))
EOF
        ;;
    autotune)
        # --gemm-autotune's gain, one binary with and without, alternating (dev/bench/ab_throughput.sh, 3 rounds):
        # Qwen2.5-1.5B 16 x 1024 r1 at 4 micro-steps, bf16 and --fp8, and the 1B at B=8; each tuned run's last
        # line is what the trials, timed alone, say the picks save a step
        qwen="--preset qwen2.5-1.5b --random-data -B 16 -T 1024 --total-batch 65536 --steps 10 --recompute 1"
        for run in "qwen:$qwen" "qwen_fp8:$qwen --fp8" "llama1b:--preset llama3.2-1b --random-data -B 8 -T 2048 --steps 12"; do
            read -r -a flags <<< "${run#*:}"
            A_FLAGS="--gemm-autotune 0" B_FLAGS="--gemm-autotune 1" OUT="$out/autotune_${run%%:*}" \
                bash dev/bench/ab_throughput.sh ./train_llama ./train_llama 3 "${flags[@]}" | tail -5 || status=1
            grep -h "GEMM autotuning" "$out/autotune_${run%%:*}"/ab_B_*.log | head -3
        done;;
    bench)
        for r in 1 2; do
            timeout 200 ./train_llama --preset llama3.2-1b -B 4 -T 2048 --random-data --steps 12 --warmup 2 \
                --recompute $r --log "$out/bench_r$r.jsonl" > "$out/bench_r$r.log" 2>&1 || status=1
            tail -4 "$out/bench_r$r.log"
        done;;
    esac
done
exit $status
