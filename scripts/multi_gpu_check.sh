#!/usr/bin/env bash
# On a machine with 2 or more GPUs: build, then check data-parallel training
# against one GPU and measure scaling. Logs and dev/bench/results/multi_gpu.jsonl
# go to $OUT (or /tmp/multi_gpu_check).
#
#   equivalence  the "small" preset, 20 steps, the same global batch (4 x 256
#                tokens) on 1 GPU and on N GPUs under ZeRO stages 0 to 3,
#                launched by mpirun, by torchrun-style variables with a TCP
#                rendezvous, and by flags with a file rendezvous, and (8 x 128
#                tokens) as 2 micro-steps (on 1 GPU too) under stages 1 to 3; losses
#                must match the 1-GPU run within TOL (bf16 gradients summed in a
#                different grouping: see docs/multi_gpu.md)
#   scaling      Llama 3.2 1B, B=8, T=2048 per GPU: tokens/s per GPU and peak
#                memory on 1 GPU and on N GPUs for each stage, and the same with
#                NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 (the network transport
#                separate hosts use)
#   scaling8b    the same for Llama 3.1 8B at B=1 (no socket runs; stage 0 and
#                1 GPU need about 120 GB: H200s)
#   checkpoint   resume bit-identical to an uninterrupted run on the same GPU
#                count (ZeRO 2, one optimizer file per rank), and on the same
#                count under ZeRO 3 (state re-sharded across stages), resume of that
#                checkpoint on 1 GPU (re-sharded), a kill -9 during saves leaves
#                a resumable newest complete checkpoint, and transformers loads
#                the saved model.safetensors + config.json; with N GPUs, a kill -9
#                of rank 1 during saves makes the other ranks exit with the
#                watchdog's error within --comm-timeout (20 s here) instead of
#                waiting forever, and a resume on N GPUs continues bit for bit
# Usage: scripts/multi_gpu_check.sh [build] [equivalence] [scaling] [scaling8b] [checkpoint]
set -u
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/multi_gpu_check}"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 # NVLink multicast must stay off on the lent machines
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
gpus=$(nvidia-smi -L | wc -l)
np="${NP:-$gpus}"
steps="${*:-build equivalence scaling}"
results="$out/multi_gpu.jsonl"
status=0
run() { # name, command...: runs with a time limit, keeps the log
    local name=$1
    shift
    echo "--- $name: $*" >> "$out/commands.log"
    timeout 300 "$@" > "$out/$name.log" 2>&1 || { echo "FAIL $name (exit $?)"; tail -5 "$out/$name.log"; status=1; }
}
mpi=(mpirun -np "$np" --bind-to none -x NCCL_NVLS_ENABLE)

for s in $steps; do
    case "$s" in
    build)
        make -j"$(nproc)" gpu > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; echo "FAIL build"; exit 1; }
        grep -q -- "-DUSE_MPI" "$out/build.log" && echo "build ok (with MPI)" || echo "build ok (without MPI)";;
    equivalence)
        small=(./train_llama --preset small -T 256 --random-data --steps 20 --warmup 2 --lr 1e-3)
        run eq_1gpu "${small[@]}" -B 4 --log "$out/eq_1gpu.jsonl"
        for z in 0 1 2 3; do
            run "eq_mpirun_z$z" "${mpi[@]}" "${small[@]}" -B $((4 / np)) --zero-stage $z --log "$out/eq_mpirun_z$z.jsonl"
        done
        # gradient accumulation: 1024 random tokens as 8 rows of 128 in two micro-steps, of 4 rows on 1 GPU
        # and of 4 / N rows per GPU (each micro-step draws the next 512 tokens, whatever the GPU count)
        run eq_1gpu_t128 "${small[@]}" -T 128 -B 4 --total-batch 1024 --log "$out/eq_1gpu_t128.jsonl"
        for z in 1 2 3; do
            run "eq_accum_z$z" "${mpi[@]}" "${small[@]}" -T 128 -B $((4 / np)) --total-batch 1024 --zero-stage $z \
                --log "$out/eq_accum_z$z.jsonl"
        done
        # torchrun-style variables and a TCP rendezvous, no MPI involved
        pids=()
        for ((r = 0; r < np; r++)); do
            RANK=$r WORLD_SIZE=$np LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 \
                timeout 300 "${small[@]}" -B $((4 / np)) --zero-stage 1 --log "$out/eq_tcp_z1.jsonl" \
                > "$out/eq_tcp_z1_rank$r.log" 2>&1 &
            pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p" || { echo "FAIL eq_tcp_z1"; status=1; }; done
        # flags and a file rendezvous
        rdv="$out/rendezvous.$$"
        pids=()
        for ((r = 0; r < np; r++)); do
            timeout 300 "${small[@]}" -B $((4 / np)) --zero-stage 1 --rank $r --world-size "$np" \
                --rendezvous "file:$rdv" --log "$out/eq_file_z1.jsonl" > "$out/eq_file_z1_rank$r.log" 2>&1 &
            pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p" || { echo "FAIL eq_file_z1"; status=1; }; done
        python3 - "$out" "$np" "$results" << 'EOF' || status=1
import json, sys
out, np_, results = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def losses(name):
    try:
        return [r["loss"] for r in map(json.loads, open(f"{out}/{name}.jsonl")) if "loss" in r]
    except OSError:
        return []
# Tolerance: the N-GPU run rounds each rank's partial gradient to bf16 and sums the
# partials in bf16 (N - 1 more roundings of 2^-8 relative at most); over 20 AdamW
# steps at lr 1e-3 that moves the loss by well under 1e-2 (measured: see the JSON).
TOL = 1e-2
bad = 0
runs = ["eq_mpirun_z0", "eq_mpirun_z1", "eq_mpirun_z2", "eq_mpirun_z3", "eq_tcp_z1", "eq_file_z1",
        "eq_accum_z1", "eq_accum_z2", "eq_accum_z3"]
for name in runs:
    ref = losses("eq_1gpu_t128" if "accum" in name else "eq_1gpu")
    got = losses(name)
    ok = len(got) == len(ref) == 20
    diff = max(abs(a - b) for a, b in zip(got, ref)) if ok else float("nan")
    ok = ok and diff <= TOL
    bad += not ok
    print(f"{'PASS' if ok else 'FAIL'} {name}: {len(got)} steps, max |loss - 1-GPU loss| = {diff:.2e} (tol {TOL:g}); "
          f"first {got[:1]}, last {got[-1:]} vs {ref[-1:]}")
    with open(results, "a") as f:
        f.write(json.dumps({"check": "equivalence", "run": name, "gpus": np_, "steps": len(got),
                            "max_abs_loss_diff": diff, "tol": TOL, "ok": ok, "losses": got, "ref_losses": ref}) + "\n")
same = losses("eq_mpirun_z1") == losses("eq_tcp_z1") == losses("eq_file_z1")
print(f"{'PASS' if same else 'FAIL'} the three launches of stage 1 give bit-identical losses")
bad += not same
sys.exit(1 if bad else 0)
EOF
        ;;
    scaling | scaling8b)
        # 1B: the throughput table, also over sockets; 8B (B = 1): where sharding's memory saving matters
        if [ "$s" = scaling ]; then
            p=sc model=llama3.2-1b b=8 steps=10 net="1 2 3"
        else
            p=sc8b model=llama3.1-8b b=1 steps=6 net=""
        fi
        big=(./train_llama --preset $model -B $b -T 2048 --random-data --steps $steps --warmup 2)
        run "${p}_1gpu" "${big[@]}" --log "$out/${p}_1gpu.jsonl"
        for z in 0 1 2 3; do
            run "${p}_z$z" "${mpi[@]}" "${big[@]}" --zero-stage $z --log "$out/${p}_z$z.jsonl"
        done
        for z in $net; do
            NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 run "${p}_z${z}_net" "${mpi[@]}" -x NCCL_P2P_DISABLE \
                -x NCCL_SHM_DISABLE "${big[@]}" --zero-stage $z --log "$out/${p}_z${z}_net.jsonl"
        done
        python3 - "$out" "$np" "$results" "$p" "$model" "$b" "$net" << 'EOF' || status=1
import json, statistics, sys
out, np_, results, p, model, net = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[7]
b = int(sys.argv[6])
def summary(name):
    try:
        recs = [r for r in map(json.loads, open(f"{out}/{name}.jsonl")) if "tokens_per_s" in r]
    except OSError:
        return None
    timed = recs[2:]  # after warm-up
    if not timed:
        return None
    per_gpu = statistics.median(r.get("tokens_per_s_per_gpu", r["tokens_per_s"]) for r in timed)
    return {"tokens_per_s_per_gpu": per_gpu, "peak_mem_gib": max(r["peak_mem_gib"] for r in recs),
            "device_mem_gib": max(r["device_mem_gib"] for r in recs), "ms": statistics.median(r["ms"] for r in timed)}
one = summary(f"{p}_1gpu")
print(f"{model}, 1 GPU:", one)
runs = [(f"{p}_z{z}", f"ZeRO {z}") for z in range(4)]
runs += [(f"{p}_z{z}_net", f"ZeRO {z}, P2P and SHM off") for z in net.split()]
for name, label in runs:
    s = summary(name)
    if s is None:
        print(f"FAIL {name}: no timed steps")
        continue
    eff = s["tokens_per_s_per_gpu"] / one["tokens_per_s_per_gpu"] if one else None
    print(f"{model} {label} on {np_} GPUs: {s['tokens_per_s_per_gpu']:.0f} tokens/s per GPU"
          + (f" ({100 * eff:.1f}% of 1 GPU)" if eff else "") + f", peak {s['peak_mem_gib']:.2f} GiB per GPU")
    with open(results, "a") as f:
        f.write(json.dumps({"check": "scaling", "run": name, "label": label, "gpus": np_, "model": model,
                            "B": b, "T": 2048, **s, "one_gpu": one, "efficiency": eff}) + "\n")
EOF
        ;;
    checkpoint)
        nano=(./train_llama --preset nano -T 128 --random-data --steps 12 --warmup 2 --lr 1e-3 --keep 0)
        ck="$out/ckpt"
        rm -rf "$ck" "$out"/ck_*.jsonl # the kills below watch these logs: an old one would fire them early
        run ck_full "${mpi[@]}" "${nano[@]}" -B $((4 / np)) --zero-stage 2 --checkpoint-dir "$ck/full" \
            --save-every 4 --log "$out/ck_full.jsonl"
        mkdir -p "$ck/same" "$ck/one" "$ck/stage3"
        cp -r "$ck/full/step_00000004" "$ck/same/"
        cp -r "$ck/full/step_00000004" "$ck/one/"
        cp -r "$ck/full/step_00000004" "$ck/stage3/"
        run ck_same "${mpi[@]}" "${nano[@]}" -B $((4 / np)) --zero-stage 2 --checkpoint-dir "$ck/same" --resume \
            --log "$out/ck_same.jsonl"
        run ck_stage3 "${mpi[@]}" "${nano[@]}" -B $((4 / np)) --zero-stage 3 --checkpoint-dir "$ck/stage3" --resume \
            --log "$out/ck_stage3.jsonl"
        run ck_one "${nano[@]}" -B 4 --checkpoint-dir "$ck/one" --resume --log "$out/ck_one.jsonl"
        # kill -9 while it saves every step, then resume: the newest complete checkpoint continues bit for bit
        run ck_ref "${nano[@]}" --steps 40 -B 4 --log "$out/ck_ref.jsonl"
        "${nano[@]}" --steps 40 -B 4 --checkpoint-dir "$ck/kill" --save-every 1 --keep 2 \
            --log "$out/ck_killed.jsonl" > "$out/ck_killed.log" 2>&1 &
        pid=$!
        # kill as soon as step 5 is logged: its checkpoint is being written then
        for _ in $(seq 600); do
            logged=$(grep -c '"loss"' "$out/ck_killed.jsonl" 2> /dev/null)
            [ "${logged:-0}" -ge 5 ] && break
            sleep 0.1
        done
        kill -9 $pid 2> /dev/null
        wait $pid 2> /dev/null
        ls "$ck/kill" > "$out/ck_kill_dir.txt" 2>&1
        run ck_resumed "${nano[@]}" --steps 40 -B 4 --checkpoint-dir "$ck/kill" --save-every 1 --keep 2 --resume \
            --log "$out/ck_resumed.jsonl"
        # the same on N GPUs, killing rank 1 only (torchrun-style launch: mpirun would end the job itself);
        # 200 steps, so that the kill lands mid-run (40 steps with a save each took under a second on 4 GPUs)
        run ck_ref_n "${mpi[@]}" "${nano[@]}" --steps 200 -B $((4 / np)) --log "$out/ck_ref_n.jsonl"
        pids=()
        t0=$(date +%s)
        for ((r = 0; r < np; r++)); do
            RANK=$r WORLD_SIZE=$np LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=29519 \
                timeout 300 "${nano[@]}" --steps 200 -B $((4 / np)) --checkpoint-dir "$ck/killn" --save-every 1 \
                --keep 2 --comm-timeout 20 --log "$out/ck_killed_n.jsonl" > "$out/ck_killed_n_rank$r.log" 2>&1 &
            pids+=($!)
        done
        for _ in $(seq 6000); do
            logged=$(grep -c '"loss"' "$out/ck_killed_n.jsonl" 2> /dev/null)
            [ "${logged:-0}" -ge 5 ] && break
            sleep 0.01
        done
        pkill -9 -P "${pids[1]}" # rank 1 itself, not the timeout wrapping it
        codes=""
        for ((r = 0; r < np; r++)); do
            wait "${pids[$r]}" 2> /dev/null
            codes="$codes $?"
        done
        echo "ranks' exit codes:$codes after $(($(date +%s) - t0)) s" > "$out/ck_killed_n_exit.txt"
        run ck_resumed_n "${mpi[@]}" "${nano[@]}" --steps 200 -B $((4 / np)) --checkpoint-dir "$ck/killn" \
            --save-every 1 --keep 2 --resume --log "$out/ck_resumed_n.jsonl"
        python3 - "$out" "$np" "$results" "$ck" << 'EOF' || status=1
import json, sys
out, np_, results, ck = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def losses(name):
    try:
        return {r["step"]: r["loss"] for r in map(json.loads, open(f"{out}/{name}.jsonl")) if "loss" in r}
    except OSError:
        return {}
full, same, one, stage3 = losses("ck_full"), losses("ck_same"), losses("ck_one"), losses("ck_stage3")
ref, resumed, killed = losses("ck_ref"), losses("ck_resumed"), losses("ck_killed")
steps = range(5, 13)
checks = [("resume on the same GPU count (ZeRO 2, a file per rank): steps 5-12 bit-identical",
           bool(same) and all(same.get(k) == full.get(k) for k in steps)),
          ("the ZeRO 2 checkpoint resumed under ZeRO 3 on as many GPUs: steps 5-12 bit-identical",
           bool(stage3) and all(stage3.get(k) == full.get(k) for k in steps))]
diff = max((abs(one[k] - full[k]) for k in steps if k in one and k in full), default=float("nan"))
checks.append((f"resume of the {np_}-GPU checkpoint on 1 GPU: steps 5-12 within 1e-2 (max diff {diff:.2e})",
               len(one) == 8 and diff <= 1e-2))
first = min(resumed) if resumed else None
checks.append((f"kill -9 after step {max(killed) if killed else '?'} of 40; resumed at step {first}, every resumed "
               "step bit-identical to the uninterrupted run",
               bool(resumed) and max(resumed) == 40 and all(resumed[k] == ref.get(k) for k in resumed)))
ref_n, resumed_n, killed_n = losses("ck_ref_n"), losses("ck_resumed_n"), losses("ck_killed_n")
codes = open(f"{out}/ck_killed_n_exit.txt").read().split(":")[1].split()[:np_]
others = [r for r in range(np_) if r != 1]
logs = {r: open(f"{out}/ck_killed_n_rank{r}.log", errors="replace").read() for r in others}
named = all(f"rank {r}:" in logs[r] and ("no progress for 20 s" in logs[r] or "NCCL reports" in logs[r])
            for r in others)
checks.append((f"kill -9 of rank 1 of {np_} after step {max(killed_n) if killed_n else '?'}: the others exit with "
               f"the watchdog's code 3 naming their rank and the cause ({open(f'{out}/ck_killed_n_exit.txt').read().strip()})",
               all(codes[r] == "3" for r in others) and named))
first_n = min(resumed_n) if resumed_n else None
checks.append((f"resumed on {np_} GPUs at step {first_n}, every resumed step bit-identical to an uninterrupted "
               f"{np_}-GPU run",
               bool(resumed_n) and max(resumed_n) == 200 and all(resumed_n[k] == ref_n.get(k) for k in resumed_n)))
try:
    import torch
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(f"{ck}/full/step_00000012", torch_dtype=torch.float32)
    tokens = torch.randint(0, model.config.vocab_size, (1, 16))
    ok = bool(torch.isfinite(model(tokens).logits).all())
    checks.append(("transformers' LlamaForCausalLM.from_pretrained loads the checkpoint; finite logits", ok))
except Exception as e:  # the message is the result
    checks.append((f"transformers loads the checkpoint: {type(e).__name__}: {e}", False))
bad = 0
for what, ok in checks:
    print(("PASS " if ok else "FAIL ") + what)
    bad += not ok
    with open(results, "a") as f:
        f.write(json.dumps({"check": "checkpoint", "what": what, "ok": ok}) + "\n")
sys.exit(1 if bad else 0)
EOF
        echo "checkpoint dir after the kill: $(tr '\n' ' ' < "$out/ck_kill_dir.txt")";;
    *)
        echo "unknown step '$s' (build, equivalence, scaling, scaling8b, checkpoint)"; status=1;;
    esac
done
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1 >> "$out/gpu.txt"
exit $status
