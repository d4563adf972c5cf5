#!/usr/bin/env python3
"""End-to-end training throughput and peak memory on one GPU, side by side:

  hf_eager         HF transformers LlamaForCausalLM, eager attention
  hf_sdpa          the same with attn_implementation="sdpa"
  hf_sdpa_compile  sdpa + torch.compile(model)
  hf_liger         sdpa + liger-kernel (RoPE, RMSNorm, SwiGLU, fused linear cross-entropy)
  train_llama      ./train_llama --random-data, at each --train-llama-recompute level
  titan_compile            torchtitan 0.2.2's Llama 3 model (its TransformerModelArgs / Transformer, built
                           through its JobConfig, model converters and parallelize_llama): on one GPU no
                           FSDP, fp32 parameters under torch.autocast bf16 (its maybe_enable_amp),
                           torch.compile per TransformerBlock (fullgraph) + compiled loss, sdpa attention
                           (its Llama 3 default; --titan-attn flex); Llama models only, only with --systems
  titan_float8_tensorwise  the same with torchao float8 training (tensorwise recipe) through torchtitan's
  titan_float8_rowwise     Float8LinearConverter (rowwise recipe); the lm_head ("output") stays bf16
                           (--titan-float8-filter)

Every system trains the same shape on fresh random tokens each step (labels =
inputs; HF shifts them inside its loss; torchtitan takes T+1 tokens as inputs and
next-token labels, as its dataloader does), with AdamW (lr 1e-4, betas 0.9/0.95,
eps 1e-8, weight decay 0.1 on matrices only, grad clip 1.0) on fp32 master
weights: the HF and torchtitan models keep fp32 parameters and run under bf16
autocast, with torch.optim.AdamW(fused=True).

One step = forward + backward + clip + optimizer.step + zero_grad, timed with
torch.cuda.synchronize() + perf_counter after warm-up steps (2; 3 for compile).
tokens/s = B*T / median step time; MFU = tokens/s * (6 N + 12 L H D T) / 989e12,
N = all parameters but the input embedding (lm_head counted once, tied or not),
llmc/model/param_layout.h llama_flops_per_token's convention. Peak memory =
torch.cuda.max_memory_allocated over the timed steps (reset after warm-up); for
train_llama its own allocator peak (the peak_mem_gib of its JSON log).

Each (system, model, B, T) runs in its own subprocess with a timeout, so an
OOM or a compiler crash cannot poison the next run. Once a system OOMs at B=1
and some T, its longer T are skipped; once it OOMs at some B at the batch
sweep's T, its larger B are skipped; after two failures (not OOM) of a system
its remaining runs are skipped. Every record is one JSON line appended to --out.

Time: the default settings of one model take ~10 min on an H100 (--dry-run
prints a rough estimate per run). Most of it is process start and, for
hf_sdpa_compile, ~1 min of compilation per run, so by default compile runs only
at T=2048 with B=1 and the largest B of --batch-sweep (--compile-full for the
whole sweep). --budget-s (default 540 per model) skips runs that would end past
the budget by the estimate, recorded as "skipped (time budget)"; the run order
(train_llama, train_llama_fp8, llmq, llmq_fp8, hf_liger, hf_sdpa, hf_eager,
hf_sdpa_compile, titan_compile, titan_float8_rowwise, titan_float8_tensorwise)
decides what is cut; the titan_* systems count as compile systems (--compile-seq-lens,
--compile-batch-sweep, --compile-warmup).

  python3 dev/bench/bench_e2e.py --dry-run                 # the plan, no torch needed
  python3 dev/bench/bench_e2e.py --quick                   # smoke test: 2 layers, T=2048, ~3 min
  python3 dev/bench/bench_e2e.py                           # Llama 3.2 1B, default settings
  python3 dev/bench/bench_e2e.py --models llama3.1-8b-cut --layers 8
  python3 dev/bench/bench_e2e.py --systems hf_liger train_llama --seq-lens 8192 65536 --batch-sweep
  python3 dev/bench/bench_e2e.py --systems train_llama --train-llama-recompute 0 1 2 3 --batch-sweep 1 2 4 8 16

The HF systems need torch and transformers; hf_liger needs liger_kernel on the
path (dev/bench/run_all.sh installs the wheel from .whl/); train_llama needs
the built ./train_llama. The titan_* systems need torchtitan 0.2.2 and torchao
0.18.0 and the few dependencies the GPU machine lacks (scripts/get_peer_wheels.sh puts
them in .whl/; run_all.sh installs them into /tmp/site); they are not in the default
--systems and run the Llama models only (another model is recorded as skipped):
  python3 dev/bench/bench_e2e.py --systems titan_compile titan_float8_tensorwise titan_float8_rowwise
(torchtitan 0.3.0 does not import with torch 2.11: it needs torch.distributed.fsdp's
DataParallelMeshDims, which is newer.) Each torchtitan run initialises torch.distributed
with one rank itself, as torchtitan's Trainer does (no torchrun); --titan-attn, --titan-ac
and --titan-float8-filter select its options (recorded in each record). torchtitan 0.2.2's
Llama 3 has no weight tying, so its Llama 3.2 1B has an untied lm_head (262M more
parameters, ~3.9 GiB more static memory than the tied HF and train_llama 1B; same FLOPs).
"""
import argparse
import datetime
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PEAK_BF16_FLOPS = 989e12  # dense bf16 peak of an H100 SXM, as train_llama.cu's PEAK_BF16_FLOPS
GIB = 1024.0 ** 3

# Shapes. rope: Llama 3.1 frequency scaling; train_llama's presets are llmc/model/llama_config.h's.
MODELS = {
    "llama3.2-1b": dict(vocab=128256, hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, ffn=8192,
                        tied=True, rope_theta=500000.0, rope_factor=32.0, rope_low=1.0, rope_high=4.0,
                        rope_orig=8192, max_pos=131072, eps=1e-5, preset="llama3.2-1b", default_layers=16,
                        llmq="llama3.2-1b"),
    # The 8B's layer shape cut to fewer layers. Static memory (fp32 weights, grads and two AdamW moments,
    # 16 bytes per parameter): 2 x 525M embedding/lm_head + 218M per layer, so 8 layers = 2.80B parameters
    # = 41.7 GiB, leaving ~35 GiB of an 80 GB H100 for activations: HF at T=2048 needs ~5 GiB, and the
    # longer T show where each system stops. 12 layers (55 GiB static) still fits HF at T=2048, 14 barely.
    "llama3.1-8b-cut": dict(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336,
                            tied=False, rope_theta=500000.0, rope_factor=8.0, rope_low=1.0, rope_high=4.0,
                            rope_orig=8192, max_pos=131072, eps=1e-5, preset="llama3.1-8b", default_layers=8,
                            llmq="llama3.1-8b"),
    # Qwen2.5 1.5B (its HF config.json): biases on q, k and v, tied, plain RoPE; llmq's headline model
    "qwen2.5-1.5b": dict(family="qwen2", vocab=151936, hidden=1536, layers=28, heads=12, kv_heads=2, head_dim=128,
                         ffn=8960, tied=True, qkv_bias=True, rope_theta=1000000.0, rope_factor=None,
                         max_pos=131072, eps=1e-6, preset="qwen2.5-1.5b", default_layers=28, llmq="qwen2.5-1.5b"),
}
HF_SYSTEMS = ["hf_eager", "hf_sdpa", "hf_sdpa_compile", "hf_liger"]
# train_llama_fp8: --fp8 (per-tensor E4M3/E5M2 Linear maps); train_llama_fp8_made: the same with --fp8-weights made
# (the weights' codes made at each use, not kept for the step: less memory); llmq / llmq_fp8: IST-DASLab/llmq's train
# (built by scripts/build_llmq.sh into .carry/llmq), --matmul-dtype bf16 / e4m3, its benchmark settings
TITAN_SYSTEMS = ["titan_compile", "titan_float8_tensorwise", "titan_float8_rowwise"]
DEFAULT_SYSTEMS = HF_SYSTEMS + ["train_llama", "train_llama_fp8", "llmq", "llmq_fp8"]
ALL_SYSTEMS = DEFAULT_SYSTEMS + ["train_llama_fp8_made"] + TITAN_SYSTEMS
# systems that compile: fewer settings by default (--compile-seq-lens, --compile-batch-sweep), more warm-up
COMPILE_SYSTEMS = ["hf_sdpa_compile"] + TITAN_SYSTEMS
# Run order: a time budget cuts the last ones first, so the slow-to-start compile runs go last.
RUN_ORDER = ["train_llama", "train_llama_fp8", "train_llama_fp8_made", "llmq", "llmq_fp8", "hf_liger", "hf_sdpa",
             "hf_eager", "hf_sdpa_compile", "titan_compile", "titan_float8_rowwise", "titan_float8_tensorwise"]
TITAN_VERSION = "0.2.2"  # the torchtitan release child_run_titan is written against (its API changes a lot)
DEFAULT_SEQ_LENS = [2048, 4096, 8192, 16384, 32768, 65536, 131072]
DEFAULT_BATCH_SWEEP = [4, 8]
OPTIM = dict(lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)


# ---------------------------------------------------------------------------------------------
# shapes, FLOPs, rough time and memory estimates (pure Python: the dry run needs no torch)

def model_shape(name, layers=None):
    s = dict(MODELS[name])
    s["layers"] = int(layers) if layers else s["default_layers"]
    return s


def param_counts(s):
    """(all parameters, tied lm_head counted once; N of the FLOPs formula)."""
    C, V, F, L = s["hidden"], s["vocab"], s["ffn"], s["layers"]
    QD, KVD = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    per_layer = 2 * C + C * QD + 2 * C * KVD + QD * C + 3 * C * F + ((QD + 2 * KVD) if s.get("qkv_bias") else 0)
    total = V * C + L * per_layer + C + (0 if s["tied"] else V * C)
    # llama_flops_per_token: total minus the embedding, plus lm_head when tied (the embedding is a lookup).
    n_flops = total - V * C + (V * C if s["tied"] else 0)
    return total, n_flops


def flops_per_token(s, T):
    _, n = param_counts(s)
    return 6.0 * n + 12.0 * s["layers"] * s["heads"] * s["head_dim"] * T


def estimate_mem_gib(system, s, B, T, recompute=1):
    """A rough guess of the peak, only to plan the dry run and the time budget; never recorded."""
    C, F, V, L = s["hidden"], s["ffn"], s["vocab"], s["layers"]
    KVD, H = s["kv_heads"] * s["head_dim"], s["heads"]
    total, _ = param_counts(s)
    static = 16.0 * total  # fp32 params, grads, AdamW m and v
    per_tok_layer = {"hf_eager": 28 * C + 8 * F + 8 * KVD + 6 * H * T, "hf_sdpa": 28 * C + 8 * F + 8 * KVD,
                     "hf_sdpa_compile": 20 * C + 6 * F + 8 * KVD, "hf_liger": 18 * C + 4 * F + 8 * KVD,
                     "titan_compile": 20 * C + 6 * F + 8 * KVD, "titan_float8_tensorwise": 18 * C + 6 * F + 8 * KVD,
                     "titan_float8_rowwise": 18 * C + 6 * F + 8 * KVD}
    # torchtitan 0.2.2: full bf16 logits, loss (fp32 cast + cross-entropy) compiled
    logits_per_tok = {"hf_eager": 12 * V, "hf_sdpa": 12 * V, "hf_sdpa_compile": 6 * V, "hf_liger": 0,
                      "titan_compile": 6 * V, "titan_float8_tensorwise": 6 * V, "titan_float8_rowwise": 6 * V}
    if system in TITAN_SYSTEMS and s["tied"]:
        static += 16.0 * V * C  # its Llama 3 cannot tie: a separate lm_head
    if system.startswith("train_llama") or system.startswith("llmq"):
        static = 18.0 * total
        act = {0: 16 * C + 8 * F + 4 * KVD, 1: 12 * C + 4 * F + 4 * KVD, 2: 10 * C + 2 * F + 4 * KVD,
               3: 2 * C}[recompute]
        fixed = 1.5 * GIB
        return (static + B * T * L * act + fixed) / GIB
    fixed = (2.5 if system == "hf_liger" else 1.5) * GIB
    return (static + B * T * (L * per_tok_layer[system] + logits_per_tok[system]) + fixed) / GIB


def estimate_run_s(system, s, B, T, steps, oom=False, accum=1):
    """Rough wall time of one run: process start, model build, compile, steps."""
    total, _ = param_counts(s)
    bparams = total / 1e9
    if system.startswith("train_llama") or system.startswith("llmq"):
        overhead = (3.0 if system.startswith("train_llama") else 15.0) + 1.0 * bparams
    else:
        overhead = 9.0 + 1.5 * bparams + (4.0 if system == "hf_liger" else 0.0)
        if system == "hf_sdpa_compile":
            overhead += 15.0 + 3.0 * s["layers"]  # ~1 min for the 16-layer 1B
        elif system in TITAN_SYSTEMS:
            # per-block compile: one block is compiled, the others reuse it; float8 adds its casts
            overhead += 30.0 + (15.0 if "float8" in system else 0.0)
    mfu = {"train_llama": 0.45, "train_llama_fp8": 0.55, "train_llama_fp8_made": 0.55, "llmq": 0.45, "llmq_fp8": 0.5,
           "hf_liger": 0.38, "hf_sdpa": 0.35, "hf_sdpa_compile": 0.40, "hf_eager": 0.25, "titan_compile": 0.40,
           "titan_float8_tensorwise": 0.48, "titan_float8_rowwise": 0.45}[system]
    step = accum * B * T * flops_per_token(s, T) / (mfu * PEAK_BF16_FLOPS)
    return overhead + (1.5 * step if oom else (steps + 0.5) * step)


# ---------------------------------------------------------------------------------------------
# the plan

def build_plan(args):
    """Runs in order, grouped by (model, system variant); each a dict."""
    plan = []
    for mname in args.models:
        s = model_shape(mname, args.layers)
        for system in RUN_ORDER:
            if system not in args.systems:
                continue
            levels = args.train_llama_recompute if system.startswith("train_llama") else [None]
            for r in levels:
                if system in COMPILE_SYSTEMS:
                    bs, ts = sorted(set(args.compile_batch_sweep)), sorted(set(args.compile_seq_lens))
                else:
                    bs, ts = sorted(set(args.batch_sweep)), sorted(set(args.seq_lens))
                settings = [(1, args.batch_t)] if (args.batch_t in ts or 1 in bs) else []
                settings += [(b, args.batch_t) for b in bs if b != 1]
                settings += [(1, t) for t in ts if t != args.batch_t]
                for B, T in settings:
                    warm = args.compile_warmup if system in COMPILE_SYSTEMS else args.warmup
                    plan.append(dict(system=system, model=mname, shape=s, layers=s["layers"], B=B, T=T,
                                     recompute=r, warmup=warm, steps=args.steps, batch_t=args.batch_t,
                                     accum=args.grad_accum))
    return plan


def level(run):
    return 1 if run["recompute"] is None else run["recompute"]


def variant(run):
    return run["system"] if run["recompute"] is None else "%s(r%d)" % (run["system"], run["recompute"])


def skip_reason(run, results):
    """'OOM (skipped, ...)' when a smaller setting of the same variant already ran out of memory;
    'skipped (...)' after two failures (not OOM) of the variant, so a broken setup costs little."""
    failures = [p for p in results if p["model"] == run["model"] and variant_of_record(p) == variant(run)
                and (p["status"].startswith("failed") or p["status"].startswith("timeout"))]
    if len(failures) >= 2:
        return "skipped (2 failures before)"
    for prev in results:
        if prev["model"] != run["model"] or variant_of_record(prev) != variant(run) \
                or not prev["status"].startswith("OOM"):
            continue
        if run["B"] == 1 and prev["B"] == 1 and prev["T"] < run["T"]:
            return "OOM (skipped, smaller T already OOM)"
        if run["T"] == run["batch_t"] and prev["T"] == run["T"] and prev["B"] < run["B"]:
            return "OOM (skipped, smaller B already OOM)"
    return None


def variant_of_record(rec):
    return rec["system"] if rec.get("recompute") is None else "%s(r%d)" % (rec["system"], rec["recompute"])


def train_llama_cmd(args, run, log_path):
    s = run["shape"]
    cmd = [args.train_llama, "--preset", s["preset"], "--random-data", "-B", str(run["B"]), "-T", str(run["T"]),
           "--steps", str(run["warmup"] + run["steps"]), "--warmup", "1", "--recompute", str(run["recompute"]),
           "--lr", repr(OPTIM["lr"]), "--beta1", repr(OPTIM["beta1"]), "--beta2", repr(OPTIM["beta2"]),
           "--eps", repr(OPTIM["eps"]), "--weight-decay", repr(OPTIM["weight_decay"]),
           "--grad-clip", repr(OPTIM["grad_clip"]), "--seed", str(args.seed), "--log", log_path]
    if run["layers"] != s["default_layers"] or s["preset"] != run["model"]:
        cmd += ["--n-layer", str(run["layers"])]
    if run["accum"] > 1:
        cmd += ["--total-batch", str(run["accum"] * run["B"] * run["T"])]
    if run["system"] in ("train_llama_fp8", "train_llama_fp8_made"):
        cmd += ["--fp8"]
    if run["system"] == "train_llama_fp8_made":
        cmd += ["--fp8-weights", "made"]
    return cmd


def llmq_cmd(args, run, inputs, log_path):
    """llmq's train at its H100 benchmark's settings (benchmarks/H100x1.md: bf16 weights and AdamW moments, CUDA
    graphs, --lmhead-chunks 4 for bf16) on random tokens, with this bench's AdamW settings; fp8: e4m3 matmuls."""
    s = run["shape"]
    cmd = [os.path.join(args.llmq, "bin", "train"), "--model=" + os.path.join(inputs, "model"), "--from-scratch",
           "--train-file=" + os.path.join(inputs, "train.bin"), "--eval-file=" + os.path.join(inputs, "eval.bin"),
           "--seq-length=%d" % run["T"], "--batch-size=%d" % run["B"], "--grad-accumulation=%d" % run["accum"],
           "--steps=%d" % (run["warmup"] + run["steps"]), "--gpus=1", "--use-cuda-graphs",
           "--model-dtype=bf16", "--opt-m-dtype=bf16", "--opt-v-dtype=bf16",
           "--matmul-dtype=" + ("e4m3" if run["system"] == "llmq_fp8" else "bf16"),
           "--lr=%g" % OPTIM["lr"], "--beta-1=%g" % OPTIM["beta1"], "--beta-2=%g" % OPTIM["beta2"],
           "--adam-epsilon=%g" % OPTIM["eps"], "--weight-decay=%g" % OPTIM["weight_decay"],
           "--grad-clip=%g" % OPTIM["grad_clip"], "--warmup=1", "--eval-every-n-steps=1000000",
           "--ckpt-interval=1000000", "--out-dir=" + os.path.join(inputs, "out"), "--log-file=" + log_path,
           # its final checkpoint, under the run's own folder: the default (ckpt/<name> in the working directory)
           # is the same path for every run, so that two benches side by side once collided on renaming it
           "--checkpoint-dir=" + os.path.join(inputs, "ckpt")]
    if run["system"] == "llmq":
        cmd.append("--lmhead-chunks=4")
    return cmd


def print_plan(args, plan):
    print("plan: %d runs; %d timed steps after %d warm-up (%d for compile); per-run timeout %ds; budget %s"
          % (len(plan), args.steps, args.warmup, args.compile_warmup, args.timeout,
             "%ds per model" % args.budget_s if args.budget_s else "none"))
    for mname in args.models:
        s = model_shape(mname, args.layers)
        total, n = param_counts(s)
        print("model %s: %d layers, hidden %d, ffn %d, heads %d/%d, vocab %d, %s; %.3fB params, static "
              "(fp32 weights + grads + AdamW) %.1f GiB; FLOPs/token at T=2048: %.3g"
              % (mname, s["layers"], s["hidden"], s["ffn"], s["heads"], s["kv_heads"], s["vocab"],
                 "tied" if s["tied"] else "untied", total / 1e9, 16 * total / GIB, flops_per_token(s, 2048)))
        fit = [L for L in range(1, s["default_layers"] * 2 + 1)
               if all(estimate_mem_gib(x, model_shape(mname, L), 1, args.batch_t) <= args.gpu_mem_gib
                      for x in args.systems)]
        if fit:
            print("  rough guess: %s %d layers of this shape fit every selected system at B=1, T=%d"
                  % ("at least" if max(fit) == s["default_layers"] * 2 else "up to", max(fit), args.batch_t))
    print("estimates below are rough guesses (memory model, MFU guesses) against %.0f GiB of GPU memory"
          % args.gpu_mem_gib)
    sim, model_t, total_t = [], {}, 0.0
    for run in plan:
        reason = skip_reason(run, sim)
        mem = estimate_mem_gib(run["system"], run["shape"], run["B"], run["T"], level(run))
        oom = mem > args.gpu_mem_gib
        est = 0.0 if reason else estimate_run_s(run["system"], run["shape"], run["B"], run["T"], run["steps"], oom,
                                                run["accum"])
        spent = model_t.get(run["model"], 0.0)
        if not reason and args.budget_s and spent + est > args.budget_s:
            reason = "skipped (time budget)"
            est = 0.0
        model_t[run["model"]] = spent + est
        total_t += est
        status = reason or ("OOM?" if oom else "ok?")
        sim.append(dict(model=run["model"], system=run["system"], recompute=run["recompute"], B=run["B"],
                        T=run["T"], status="OOM" if status == "OOM?" else status))
        line = "  %-15s %-16s L=%-2d B=%-2d T=%-6d mem~%6.1f GiB  time~%5.0fs  %s" % (
            run["model"], variant(run), run["layers"], run["B"], run["T"], mem, est, status)
        print(line)
        if run["system"].startswith("train_llama") and not reason and args.verbose:
            print("      " + " ".join(shlex.quote(c) for c in train_llama_cmd(args, run, "LOG.jsonl")))
    for m, t in model_t.items():
        print("estimated wall time %s: %.1f min" % (m, t / 60))
    print("estimated wall time in all: %.1f min (plus ~10 s for the version probe)" % (total_t / 60))


# ---------------------------------------------------------------------------------------------
# the parent: environment, subprocesses, records

def git_commit():
    """BENCH_GIT_COMMIT when set (the GPU machine's copy of the tree may carry a stale .git), else git."""
    if os.environ.get("BENCH_GIT_COMMIT"):
        return os.environ["BENCH_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            commit = out.stdout.strip()
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                   capture_output=True, text=True, timeout=10)
            return commit + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def probe_env(args):
    """Versions and GPU name, from a child (the parent never creates a CUDA context)."""
    env = {"gpu": "unknown", "torch": None, "transformers": None, "liger_kernel": None, "triton": None,
           "torchtitan": None, "torchao": None, "cuda": None, "cudnn": None, "python": sys.version.split()[0],
           "driver": None}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            first = out.stdout.strip().splitlines()[0].split(",")
            env["gpu"] = first[0].strip()
            env["driver"] = first[1].strip() if len(first) > 1 else None
            env["gpu_mem_total"] = first[2].strip() if len(first) > 2 else None
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        out = subprocess.run([args.python, os.path.abspath(__file__), "--probe"], capture_output=True, text=True,
                             timeout=120, cwd=REPO)
        for line in out.stdout.splitlines():
            if line.startswith("PROBE "):
                env.update({k: v for k, v in json.loads(line[6:]).items() if v is not None})
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    env["git_commit"] = git_commit()
    return env


def child_probe():
    info = {}
    try:
        import torch
        info.update(torch=torch.__version__, cuda=torch.version.cuda)
        try:
            info["cudnn"] = torch.backends.cudnn.version()
        except Exception:  # noqa: BLE001
            info["cudnn"] = None
    except Exception:  # noqa: BLE001
        pass
    for mod, key in (("transformers", "transformers"), ("triton", "triton"), ("liger_kernel", "liger_kernel"),
                     ("torchtitan", "torchtitan"), ("torchao", "torchao")):
        try:
            from importlib import metadata
            info[key] = metadata.version({"liger_kernel": "liger-kernel"}.get(mod, mod))
        except Exception:  # noqa: BLE001
            try:
                info[key] = __import__(mod).__version__
            except Exception:  # noqa: BLE001
                info[key] = None
    print("PROBE " + json.dumps(info), flush=True)


def last_error_line(text):
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    for l in reversed(lines):
        if l.startswith("error") or "Error" in l or "error:" in l or "FAIL" in l:
            return l[:300]
    return lines[-1][:300] if lines else "no output"


def is_oom_text(text):
    t = text.lower()
    return ("out of memory" in t or "out of gpu memory" in t or "outofmemoryerror" in t
            or "cublas_status_alloc_failed" in t or "cudaerrormemoryallocation" in t)


def quantile(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    pos = (len(xs) - 1) * q
    lo, hi = int(math.floor(pos)), int(math.ceil(pos))
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def run_subprocess(cmd, timeout, log_base, env=None):
    """(returncode or 'timeout', stdout text, stderr text); the child's process group dies on timeout."""
    with open(log_base + ".out", "w") as fo, open(log_base + ".err", "w") as fe:
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, cwd=REPO, env=env, start_new_session=True)

        def stop(signum, frame):
            # an outer time limit or ^C ends this script: its own session would keep the child (and its GPU
            # memory) alive for the next run, so the finally below ends it first
            raise SystemExit(128 + signum)
        handlers = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            # the child's own session: also ends helpers it left behind (e.g. compile workers holding memory)
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()
    with open(log_base + ".out") as fo, open(log_base + ".err") as fe:
        return rc, fo.read(), fe.read()


def failed_status(args, run, rc, text, steps):
    """A run's status when it did not end with all its steps logged ('timeout ...', 'OOM', 'failed: ...'), else
    None. steps: the step records its log holds."""
    if rc == "timeout":
        return "timeout (%ds)" % args.timeout
    if rc != 0 or len(steps) < run["warmup"] + run["steps"]:
        return "OOM" if is_oom_text(text) else "failed: %s" % last_error_line(text)
    return None


def step_times(ms):
    """The median and 20/80% quantiles of the timed steps' ms."""
    return dict(step_ms_median=quantile(ms, 0.5), step_ms_q20=quantile(ms, 0.2), step_ms_q80=quantile(ms, 0.8))


def run_train_llama(args, run, log_base):
    jsonl = log_base + ".jsonl"
    if os.path.exists(jsonl):
        os.remove(jsonl)
    binary = args.train_llama if os.path.isabs(args.train_llama) else os.path.join(REPO, args.train_llama)
    if not os.path.exists(binary):
        return {"status": "failed: %s not found (make -j16 train_llama)" % args.train_llama}
    cmd = train_llama_cmd(args, run, jsonl)
    rc, out, err = run_subprocess(cmd, args.timeout, log_base)
    return dict(train_llama_result(args, run, rc, out + "\n" + err, jsonl),
                command=" ".join(shlex.quote(c) for c in cmd))


def train_llama_result(args, run, rc, text, jsonl):
    """What a train_llama run measured, from its (rank 0's) JSON log: the median of the steps after the warm-up,
    and the most memory of any step; or why it did not end (failed_status)."""
    steps = []
    try:
        with open(jsonl) as f:
            steps = [json.loads(l) for l in f if '"loss"' in l]
    except (OSError, ValueError):
        pass
    status = failed_status(args, run, rc, text, steps)
    if status is not None:
        return {"status": status}
    timed = steps[run["warmup"]:]
    times = step_times([st["ms"] for st in timed])
    return dict(status="ok", **times,
                tokens_per_s=run["accum"] * run["B"] * run["T"] / (times["step_ms_median"] / 1e3),
                mfu_reported=quantile([st["mfu"] for st in timed], 0.5),
                peak_mem_gib=max(st["peak_mem_gib"] for st in steps),
                device_mem_gib=max(st["device_mem_gib"] for st in steps),
                reserved_gib=None, n_timed_steps=len(timed),
                loss_first=steps[0]["loss"], loss_last=steps[-1]["loss"])


def llmq_inputs(args, run, logs):
    """The model directory (config.json alone) and random token files llmq trains on, made once per model by
    scripts/llmq_inputs.py in the logs folder."""
    d = os.path.join(logs, "llmq_inputs_%s_L%d" % (run["model"], run["layers"]))
    if not os.path.exists(os.path.join(d, "eval.bin")):
        need = (run["warmup"] + run["steps"] + 2) * run["accum"] * run["B"] * run["T"]
        subprocess.run([args.python, os.path.join(REPO, "scripts", "llmq_inputs.py"), d, "--model",
                        run["shape"]["llmq"], "--layers", str(run["layers"]), "--random-tokens",
                        str(max(need, 1 << 22))], check=True)
    return d


LLMQ_CAUGHT = re.compile(r"Thread \d+: uncaught exception(?::| of type) (.+)")


def llmq_caught(text):
    """What llmq's worker thread caught, as scripts/build_llmq.sh's patch prints it to stderr, or None."""
    m = LLMQ_CAUGHT.search(text)
    return m.group(1).strip()[:300] if m else None


def llmq_failure(args, cmd, status, text, log_base):
    """A failed llmq run's status, naming its first error. Under CUDA graphs an exception unwinds through the
    capture and only the allocator's cudaErrorStreamCaptureUnsupported is printed, so such a run is repeated once
    without graphs (at most 120 s) for the error that started it."""
    caught = llmq_caught(text)
    if caught:
        return "failed: " + caught
    if "--use-cuda-graphs" not in cmd or not status.startswith("failed: "):
        return status
    rc, out, err = run_subprocess([c for c in cmd if c != "--use-cuda-graphs"], min(args.timeout, 120),
                                  log_base + ".no_graphs")
    if rc == 0:
        return status + " (without CUDA graphs it trains)"
    cause = llmq_caught(out + "\n" + err) or last_error_line(out + "\n" + err)
    return "failed: %s (without CUDA graphs; with them: %s)" % (cause, status[len("failed: "):])


def run_llmq(args, run, log_base):
    """llmq's own log: a JSON line per step with its duration_ms; the peak device memory is nvidia-smi's
    memory.used of the GPU, sampled every 0.2 s (llmq allocates its buffers up front, so it is close to its
    allocator's total; includes the CUDA context, unlike the torch and train_llama peaks)."""
    if not run["shape"].get("llmq"):
        return {"status": "skipped (llmq has no config for this model)"}
    if not os.path.exists(os.path.join(args.llmq, "bin", "train")):
        return {"status": "failed: %s/bin/train not found (scripts/build_llmq.sh)" % args.llmq}
    try:
        inputs = llmq_inputs(args, run, os.path.dirname(log_base))
    except (OSError, subprocess.SubprocessError) as e:
        return {"status": "failed: llmq inputs: %s" % e}
    log_json = log_base + ".llmq.json"
    cmd = llmq_cmd(args, run, inputs, log_json)
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    smi = subprocess.Popen(["nvidia-smi", "-i", gpu, "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                            "-lms", "200"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        rc, out, err = run_subprocess(cmd, args.timeout, log_base)
    finally:
        smi.terminate()
        used = [float(x) for x in smi.communicate()[0].split() if x.replace(".", "", 1).isdigit()]
    rec = {"command": " ".join(shlex.quote(c) for c in cmd)}
    steps = []
    try:
        with open(log_json) as f:
            for line in f:
                line = line.strip().rstrip(",")
                if '"log": "step"' in line:
                    steps.append(json.loads(line))
    except (OSError, ValueError):
        pass
    rec["status"] = failed_status(args, run, rc, out + "\n" + err, steps)
    if rec["status"] is not None:
        rec["status"] = llmq_failure(args, cmd, rec["status"], out + "\n" + err, log_base)
    else:
        ms = [st["duration_ms"] for st in steps[run["warmup"]:]]
        times = step_times(ms)
        rec.update(status="ok", **times, tokens_per_s=steps[-1]["step_tokens"] / (times["step_ms_median"] / 1e3),
                   peak_mem_gib=max(used) / 1024.0
                   if used else None, device_mem_gib=max(used) / 1024.0 if used else None,
                   peak_mem_source="nvidia-smi memory.used", n_timed_steps=len(ms),
                   loss_first=steps[0]["loss"], loss_last=steps[-1]["loss"])
        if steps[-1]["step_tokens"] != run["accum"] * run["B"] * run["T"]:
            rec["status"] = "failed: llmq stepped %d tokens, not %d" % (steps[-1]["step_tokens"],
                                                                        run["accum"] * run["B"] * run["T"])
    return rec


def run_hf(args, run, log_base, extra=None):
    spec = dict(system=run["system"], shape=run["shape"], B=run["B"], T=run["T"], warmup=run["warmup"],
                steps=run["steps"], seed=args.seed, optim=OPTIM, accum=run["accum"], **(extra or {}))
    env = dict(os.environ)
    if args.expandable_segments:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    cmd = [args.python, os.path.abspath(__file__), "--child", json.dumps(spec)]
    rc, out, err = run_subprocess(cmd, args.timeout, log_base, env=env)
    result = None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[7:])
    if result is not None:
        return result
    text = out + "\n" + err
    if rc == "timeout":
        return {"status": "timeout (%ds)" % args.timeout}
    return {"status": "OOM" if is_oom_text(text) else "failed: %s" % last_error_line(text)}


def run_titan(args, run, log_base):
    """A torchtitan run: a child like the HF runs (child_run_titan), for the Llama models only."""
    s = run["shape"]
    if s.get("family", "llama") != "llama" or not s["preset"].startswith("llama3"):
        return {"status": "skipped (torchtitan's Llama 3 model only: no %s)" % run["model"]}
    titan = dict(attn=args.titan_attn, ac=args.titan_ac, float8_filter=list(args.titan_float8_filter))
    return run_hf(args, run, log_base, extra={"titan": titan})


def make_record(args, run, env, res, wall):
    s = run["shape"]
    total, n = param_counts(s)
    fpt = flops_per_token(s, run["T"])
    rec = dict(system=run["system"], model=run["model"], layers=run["layers"], B=run["B"], T=run["T"],
               status=res.get("status", "failed: no status"), tokens_per_s=None, mfu=None, peak_mem_gib=None,
               reserved_gib=None, device_mem_gib=None, step_ms_median=None, step_ms_q20=None, step_ms_q80=None)
    rec.update({k: v for k, v in res.items() if k not in ("status",)})
    if rec["tokens_per_s"] is not None:
        rec["mfu"] = rec["tokens_per_s"] * fpt / PEAK_BF16_FLOPS
    rec.update(recompute=run["recompute"], warmup_steps=run["warmup"], timed_steps=run["steps"],
               grad_accum=run["accum"], params_total=total, params_flops=n, flops_per_token=fpt, peak_flops=PEAK_BF16_FLOPS,
               gpu=rec.get("gpu") or env.get("gpu"),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               torch=env.get("torch"), transformers=env.get("transformers"), liger_kernel=env.get("liger_kernel"),
               torchtitan=env.get("torchtitan"), torchao=env.get("torchao"),
               triton=env.get("triton"), cuda=env.get("cuda"), cudnn=env.get("cudnn"), driver=env.get("driver"),
               python=env.get("python"), git_commit=env.get("git_commit"), wall_s=round(wall, 1),
               optimizer="AdamW lr %g betas (%g, %g) eps %g wd %g (matrices) clip %g" % (
                   OPTIM["lr"], OPTIM["beta1"], OPTIM["beta2"], OPTIM["eps"], OPTIM["weight_decay"],
                   OPTIM["grad_clip"]))
    if args.series:
        rec["series"] = args.series
    if (run["system"] in HF_SYSTEMS or run["system"] in TITAN_SYSTEMS) and args.expandable_segments:
        rec["alloc_conf"] = "expandable_segments:True"
    return rec


def append_record(rec, paths):
    line = json.dumps(rec)
    for p in paths:
        if not p:
            continue
        d = os.path.dirname(os.path.abspath(p))
        os.makedirs(d, exist_ok=True)
        with open(p, "a") as f:
            f.write(line + "\n")


def cell(rec):
    if rec is None:
        return ""
    st = rec["status"]
    if st == "ok":
        peak = rec.get("peak_mem_gib")  # None: not measured (llmq without nvidia-smi samples, a CPU smoke run)
        return "%6.1fk %4.1f%% %s" % (rec["tokens_per_s"] / 1e3, 100 * rec["mfu"],
                                      "%5.1fG" % peak if peak is not None else "    ?G")
    if st.startswith("OOM"):
        return "OOM" + ("*" if "skipped" in st else "")
    if st.startswith("skipped"):
        return "skipped"
    if st.startswith("timeout"):
        return "timeout"
    return "failed"


def print_table(records):
    if not records:
        return
    cols = []
    for r in records:
        v = variant_of_record(r)
        if v not in cols:
            cols.append(v)
    order = {v: i for i, v in enumerate(["hf_eager", "hf_sdpa", "hf_sdpa_compile", "hf_liger"] + TITAN_SYSTEMS)}
    cols.sort(key=lambda v: (order.get(v, 10), v))
    width = 21
    for model in sorted(set((r["model"], r["layers"]) for r in records)):
        rows = sorted(set((r["B"], r["T"]) for r in records if (r["model"], r["layers"]) == model),
                      key=lambda bt: (bt[1], bt[0]))
        print("\n%s, %d layers: tokens/s, MFU, peak GiB (OOM* = skipped after a smaller setting ran out)"
              % model)
        print("%-12s" % "B x T" + "".join("%-*s" % (width, c[:width - 1]) for c in cols))
        for B, T in rows:
            line = "%-12s" % ("%d x %d" % (B, T))
            for c in cols:
                rec = None
                for r in records:
                    if (r["model"], r["layers"]) == model and (r["B"], r["T"]) == (B, T) and variant_of_record(r) == c:
                        rec = r
                line += "%-*s" % (width, cell(rec))
            print(line)


def main_parent(args):
    plan = build_plan(args)
    if args.dry_run:
        print_plan(args, plan)
        return 0
    out = os.path.abspath(args.out)
    logs = os.path.abspath(args.logs_dir or os.path.join(os.path.dirname(out), "logs"))
    os.makedirs(logs, exist_ok=True)
    env = probe_env(args)
    print("env: " + json.dumps(env), flush=True)
    records, model_t = [], {}
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    for run in plan:
        reason = skip_reason(run, records)
        spent = model_t.get(run["model"], 0.0)
        if not reason and args.budget_s:
            mem = estimate_mem_gib(run["system"], run["shape"], run["B"], run["T"], level(run))
            est = estimate_run_s(run["system"], run["shape"], run["B"], run["T"], run["steps"],
                                 mem > args.gpu_mem_gib, run["accum"])
            if spent + min(est, args.timeout) > args.budget_s:
                reason = "skipped (time budget)"
        t0 = time.perf_counter()
        if reason:
            res = {"status": reason}
        else:
            tag = "%s_%s_L%d_%s_B%d_T%d" % (stamp, run["model"], run["layers"], variant(run).replace("(", "_")
                                            .replace(")", ""), run["B"], run["T"])
            log_base = os.path.join(logs, tag)
            print("run %-16s %-15s L=%d B=%d T=%d ..." % (variant(run), run["model"], run["layers"], run["B"],
                                                          run["T"]), end=" ", flush=True)
            res = run_train_llama(args, run, log_base) if run["system"].startswith("train_llama") else \
                run_llmq(args, run, log_base) if run["system"].startswith("llmq") else \
                run_titan(args, run, log_base) if run["system"] in TITAN_SYSTEMS else run_hf(args, run, log_base)
            res["log"] = os.path.relpath(log_base, REPO) if log_base.startswith(REPO + os.sep) else log_base
        wall = time.perf_counter() - t0
        model_t[run["model"]] = spent + wall
        rec = make_record(args, run, env, res, wall)
        records.append(rec)
        append_record(rec, [out, args.mirror])
        if not reason:
            print("%s (%.0fs)" % (cell(rec) if rec["status"] in ("ok",) or rec["status"].startswith("OOM")
                                  else rec["status"], wall), flush=True)
    print_table(records)
    print("\nrecords appended to %s" % os.path.relpath(out, os.getcwd()))
    return 0


# ---------------------------------------------------------------------------------------------
# the child: one HF run (imports torch; never imported by the parent)

def child_main(spec):
    result = {"status": "failed: child did not finish"}
    try:
        result = child_run_titan(spec) if spec["system"] in TITAN_SYSTEMS else child_run(spec)
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        msg = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else "")
        result = {"status": "OOM" if is_oom_text(type(e).__name__ + " " + str(e)) else "failed: " + msg[:300]}
    if os.environ.get("RANK", "0") == "0" or not result.get("status", "").startswith("ok"):  # one rank speaks
        print("RESULT " + json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)  # skip teardown (compile workers, CUDA) that could hang or crash after the result


def hf_classes(s):
    """(config class, model class, modeling module, liger's patch function) of the shape's family."""
    if s.get("family", "llama") == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM
        from transformers.models.qwen2 import modeling_qwen2
        return Qwen2Config, Qwen2ForCausalLM, modeling_qwen2, "apply_liger_kernel_to_qwen2"
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama import modeling_llama
    return LlamaConfig, LlamaForCausalLM, modeling_llama, "apply_liger_kernel_to_llama"


def hf_config(s, attn):
    config_class = hf_classes(s)[0]
    common = dict(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["ffn"],
                  num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                  max_position_embeddings=s["max_pos"], rms_norm_eps=s["eps"], initializer_range=0.02,
                  tie_word_embeddings=bool(s["tied"]), hidden_act="silu", use_cache=False, bos_token_id=None,
                  eos_token_id=None, pad_token_id=None)
    if s.get("family", "llama") == "qwen2":  # q, k, v biases are built in; head_dim is hidden / heads
        assert s["head_dim"] * s["heads"] == s["hidden"]
        config = config_class(**common, rope_parameters={"rope_type": "default", "rope_theta": s["rope_theta"]},
                              use_sliding_window=False)
    else:
        rope = {"rope_type": "llama3", "rope_theta": s["rope_theta"], "factor": s["rope_factor"],
                "low_freq_factor": s["rope_low"], "high_freq_factor": s["rope_high"],
                "original_max_position_embeddings": s["rope_orig"]}
        config = config_class(**common, head_dim=s["head_dim"], rope_parameters=rope, attention_bias=False,
                              mlp_bias=False)
    config._attn_implementation = attn
    return config


def child_run(spec):
    import torch
    system, s, B, T = spec["system"], spec["shape"], spec["B"], spec["T"]
    torch.manual_seed(spec["seed"])
    torch.backends.cuda.matmul.allow_tf32 = True  # only fp32 matmuls outside autocast (none in the model)
    torch.backends.cudnn.allow_tf32 = True
    info = {"gpu": torch.cuda.get_device_name(0)}

    _, model_class, modeling, liger_patch = hf_classes(s)
    if system == "hf_liger":
        # Before the model exists: it swaps the modeling module's RMSNorm, MLP and apply_rotary_pos_emb,
        # and the CausalLM's forward for its fused linear cross-entropy forward, which in training mode
        # with labels never materialises the logits.
        import liger_kernel.transformers
        getattr(liger_kernel.transformers, liger_patch)(rope=True, rms_norm=True, swiglu=True,
                                                        fused_linear_cross_entropy=True, cross_entropy=False)

    attn = "eager" if system == "hf_eager" else "sdpa"
    config = hf_config(s, attn)
    try:
        with torch.device("cuda"):
            model = model_class(config)
    except Exception as e:  # noqa: BLE001 -- fall back to building on the CPU, unless out of memory
        if is_oom_text(type(e).__name__ + " " + str(e)):
            raise
        print("building on cuda failed (%s); building on the CPU" % e, file=sys.stderr)
        model = model_class(config).to("cuda")
    model = model.float().train()
    assert model.config._attn_implementation == attn, model.config._attn_implementation
    params = list(model.parameters())
    assert all(p.dtype == torch.float32 and p.is_cuda for p in params)
    if s["tied"]:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "lm_head is not tied"
    info["params_counted"] = sum(p.numel() for p in params)
    info["attn_implementation"] = attn
    if system == "hf_liger":
        layer = model.model.layers[0]
        patched = dict(mlp=type(layer.mlp).__name__, norm=type(layer.input_layernorm).__name__,
                       rope=getattr(modeling.apply_rotary_pos_emb, "__module__", "?"),
                       forward=getattr(type(model).forward, "__module__", "?"))
        info["liger_patched"] = patched
        if "Liger" not in patched["mlp"] or "Liger" not in patched["norm"] or "liger" not in patched["rope"] \
                or "liger" not in patched["forward"]:
            raise RuntimeError("liger did not patch the model: %s" % patched)

    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    o = spec["optim"]
    groups = [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"], fused=True)
        info["optimizer_impl"] = "fused"
    except (TypeError, RuntimeError) as e:
        print("fused AdamW unavailable (%s); foreach" % e, file=sys.stderr)
        opt = torch.optim.AdamW(groups, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"], foreach=True)
        info["optimizer_impl"] = "foreach"

    fwd = model
    if system == "hf_sdpa_compile":
        fwd = torch.compile(model)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(spec["seed"])

    accum = spec.get("accum", 1)

    def step():
        xs = [torch.randint(0, s["vocab"], (B, T), device="cuda", generator=gen) for _ in range(accum)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for x in xs:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                # only the loss is kept: the output's logits (when there are any) die before backward,
                # as in a usual training loop
                loss = fwd(input_ids=x, labels=x, use_cache=False).loss / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, o["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return time.perf_counter() - t0, loss.item() * accum

    losses, warm_s = [], []
    for _ in range(spec["warmup"]):
        dt, l = step()
        warm_s.append(dt)
        losses.append(l)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(spec["steps"]):
        dt, l = step()
        times.append(dt)
        losses.append(l)
    if not all(math.isfinite(l) for l in losses):
        raise RuntimeError("non-finite loss: %s" % losses)
    free_b, total_b = torch.cuda.mem_get_info()
    ms = [t * 1e3 for t in times]
    med = quantile(ms, 0.5)
    info.update(status="ok", **step_times(ms),
                tokens_per_s=accum * B * T / (med / 1e3), peak_mem_gib=torch.cuda.max_memory_allocated() / GIB,
                reserved_gib=torch.cuda.max_memory_reserved() / GIB, device_mem_gib=(total_b - free_b) / GIB,
                gpu_mem_total_gib=total_b / GIB, n_timed_steps=len(times), loss_first=losses[0],
                loss_last=losses[-1], warmup_ms=[round(t * 1e3, 1) for t in warm_s],
                step_ms_all=[round(t, 2) for t in ms])
    return info


# ---------------------------------------------------------------------------------------------
# the child: one torchtitan run (imports torch and torchtitan 0.2.2; never imported by the parent)

def titan_model_args(s, attn):
    """torchtitan 0.2.2's own TransformerModelArgs for the shape: its "8B" flavor for the 8B, and for the
    1B (torchtitan 0.2.2 has no 1B flavor) the same fields with Llama 3.2 1B's numbers; cut to s["layers"],
    with the preset's RoPE scaling (its RoPEScalingArgs: factor 8 for 3.1, 32 for 3.2) and attention type.
    Its FeedForward rounds int(ffn_dim_multiplier * int(8 dim / 3)) up to a multiple of multiple_of:
    1.3 and 1024 give the 8B's 14336, 1.5 and 256 the 1B's 8192 (checked against the built model)."""
    import dataclasses
    from torchtitan.models.llama3 import TransformerModelArgs, llama3_args
    from torchtitan.models.llama3.model.args import RoPEScalingArgs
    if s["preset"] == "llama3.1-8b":
        base = llama3_args["8B"]
    elif s["preset"] == "llama3.2-1b":
        base = TransformerModelArgs(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.5,
                                    multiple_of=256, rope_theta=500000)
    else:
        raise ValueError("no torchtitan Llama 3 args for %s" % s["preset"])
    rope = RoPEScalingArgs(scaling_factor=s["rope_factor"], low_freq_factor=s["rope_low"],
                           high_freq_factor=s["rope_high"], original_max_position_embeddings=s["rope_orig"])
    # attn_mask_type causal: one document per sequence (the flex flavors' block_causal splits at eos tokens)
    margs = dataclasses.replace(base, n_layers=s["layers"], vocab_size=s["vocab"], norm_eps=s["eps"],
                                rope_theta=s["rope_theta"], rope_scaling_args=rope, max_seq_len=s["max_pos"],
                                attn_type=attn, attn_mask_type="causal")
    assert (margs.dim, margs.n_heads, margs.n_kv_heads, margs.dim // margs.n_heads) == \
        (s["hidden"], s["heads"], s["kv_heads"], s["head_dim"]), margs
    return margs


def titan_job_config(system, s, B, T, warmup, steps, accum, o, tt, cpu, world=1):
    """torchtitan's JobConfig as its command line would set it (--model.converters quantize.linear.float8
    --quantize.linear.float8.recipe_name ... --compile.enable ...); its defaults otherwise: training.dtype
    float32 (fp32 parameters) and mixed_precision_param bfloat16, which on one device without FSDP means
    torch.autocast(bf16) around forward + loss (distributed.utils.maybe_enable_amp), and on several FSDP2's
    bf16 parameters with fp32 gradient reductions. Several ranks (dev/bench/bench_multi_gpu.py): FSDP2 over
    all of them, or HSDP with tt["dp_replicate"] replicas; tensorwise float8 then all-gathers float8 weights
    with their scales precomputed after each optimizer step, as its docs advise."""
    from torchtitan.config import JobConfig
    jc = JobConfig()
    jc.job.dump_folder = tempfile.mkdtemp(prefix="titan_")
    jc.model.name = "llama3"
    jc.model.flavor = {"llama3.1-8b": "8B"}.get(s["preset"], "1B (bench_e2e.py)")
    jc.training.local_batch_size = B
    jc.training.global_batch_size = B * accum * world  # gradient accumulation, as its Trainer derives it
    jc.parallelism.data_parallel_replicate_degree = tt.get("dp_replicate", 1)
    jc.parallelism.data_parallel_shard_degree = -1  # FSDP over the ranks the replicas leave
    jc.training.seq_len = T
    jc.training.steps = warmup + steps
    jc.training.max_norm = o["grad_clip"]
    jc.compile.enable = not cpu
    jc.compile.components = ["model", "loss"]
    jc.activation_checkpoint.mode = tt["ac"]
    if system.startswith("titan_float8_"):
        jc.model.converters = ["quantize.linear.float8"]
        f8 = jc.quantize.linear.float8
        f8.recipe_name = system[len("titan_float8_"):]
        f8.filter_fqns = list(tt["float8_filter"])
        f8.emulate = cpu  # the CPU smoke test only: torchao's emulation, no compile (its converter's rule)
        if world > 1 and f8.recipe_name == "tensorwise":  # its float8 all-gather: tensorwise without a recipe name
            f8.recipe_name = None
            f8.enable_fsdp_float8_all_gather = True
            f8.precompute_float8_dynamic_scale_for_fsdp = True
    return jc


def child_run_titan(spec):
    """torchtitan 0.2.2's Trainer.__init__ and train_step, in their order, with this bench's data and
    optimizer: the model on the meta device, its model converters (float8), parallelize_llama (AC,
    torch.compile per block; no TP/CP/FSDP/DDP on one rank), to_empty + init_weights on the GPU, its
    cross-entropy loss (sum over tokens / the step's token count, compiled), forward + loss under its
    maybe_enable_amp, its clip_grad_norm_. The optimizer is this bench's AdamW (weight decay on matrices
    only, fused), not torchtitan's build_optimizers (which decays every parameter)."""
    import torch
    system, s, B, T, o, tt = spec["system"], spec["shape"], spec["B"], spec["T"], spec["optim"], spec["titan"]
    accum = spec.get("accum", 1)
    cpu = os.environ.get("BENCH_TITAN_CPU") == "1"  # smoke test of the calls on the CPU (fp32, no compile)
    # one rank, no torchrun (torchrun's variables, where it started this rank, win): torchtitan's
    # init_distributed reads the usual env:// variables
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                 ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    if "MASTER_PORT" not in os.environ:
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    torch.manual_seed(spec["seed"])
    import torchtitan
    from torchtitan.components.loss import IGNORE_INDEX, build_cross_entropy_loss
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.llama3 import Transformer, parallelize_llama
    from torchtitan.protocols.model_converter import build_model_converters
    from torchtitan.tools import utils as tt_utils
    from torchtitan.tools.logging import init_logger
    init_logger()
    version = getattr(torchtitan, "__version__", "?")
    if not version.startswith(TITAN_VERSION):
        print("warning: torchtitan %s, written against %s" % (version, TITAN_VERSION), file=sys.stderr)

    jc = titan_job_config(system, s, B, T, spec["warmup"], spec["steps"], accum, o, tt, cpu,
                          int(os.environ["WORLD_SIZE"]))
    # Trainer.__init__
    if cpu:
        device, device_type = torch.device("cpu"), "cpu"
        import torch.distributed as dist
        import torchtitan.distributed.parallel_dims as titan_dims
        dist.init_process_group("gloo")  # init_distributed would pick nccl (its device_type is cuda)
        titan_dims.device_type = "cpu"  # and its device mesh (several ranks) the GPUs
    else:
        device_type = tt_utils.device_type
        device = torch.device("%s:%d" % (device_type, int(os.environ["LOCAL_RANK"])))
        tt_utils.device_module.set_device(device)
    world = dist_utils.init_distributed(jc.comm, enable_cpu_backend=jc.training.enable_cpu_offload,
                                        base_folder=jc.job.dump_folder)
    par = jc.parallelism
    parallel_dims = ParallelDims(dp_shard=par.data_parallel_shard_degree,
                                 dp_replicate=par.data_parallel_replicate_degree, cp=par.context_parallel_degree,
                                 tp=par.tensor_parallel_degree, pp=par.pipeline_parallel_degree,
                                 ep=par.expert_parallel_degree, etp=par.expert_tensor_parallel_degree,
                                 world_size=world)
    gc_handler = tt_utils.GarbageCollection(gc_freq=jc.training.gc_freq, debug=jc.training.gc_debug)
    dist_utils.set_determinism(parallel_dims, device, jc.debug, distinct_seed_mesh_dims=["pp"])
    model_args = titan_model_args(s, tt["attn"])
    model_args.update_from_config(jc)  # max_seq_len = T: the RoPE table
    with torch.device("meta"), tt_utils.set_default_dtype(TORCH_DTYPE_MAP[jc.training.dtype]):
        model = Transformer(model_args)
    converters = build_model_converters(jc, parallel_dims)
    converters.convert(model)
    loss_fn = build_cross_entropy_loss(jc)
    batch_degree = parallel_dims.get_mesh("batch").size() if parallel_dims.dp_enabled else 1  # as its Trainer
    grad_accum = jc.training.global_batch_size // (jc.training.local_batch_size * batch_degree)
    assert grad_accum == accum
    model = parallelize_llama(model, parallel_dims, jc)
    if cpu and world > 1:  # the CPU smoke test: gloo lacks the PREMUL_SUM FSDP reduces with here; an average
        from torch.distributed.fsdp import FSDPModule
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(float(world))
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    train_context = dist_utils.get_train_context(False)
    amp = dist_utils.maybe_enable_amp(parallel_dims, jc.training.mixed_precision_param, device_type)

    layer0 = model.layers["0"]
    layer0 = getattr(layer0, "_orig_mod", layer0)  # torch.compile's OptimizedModule
    ffn = layer0.feed_forward.w1.weight.shape[0]
    if ffn != s["ffn"] or model.output.weight.shape != (s["vocab"], s["hidden"]):
        raise RuntimeError("torchtitan's model has ffn %d, output %s; expected %d, (%d, %d)" % (
            ffn, tuple(model.output.weight.shape), s["ffn"], s["vocab"], s["hidden"]))
    params = [p for p in model.parameters()]
    tied = model.output.weight is model.tok_embeddings.weight
    info = {"gpu": "cpu" if cpu else torch.cuda.get_device_name(0)}
    info.update(params_counted=sum(p.numel() for p in params), titan_version=version, titan_attn=tt["attn"],
                titan_ac=tt["ac"], titan_compile=jc.compile.enable, titan_compiled_blocks=sum(
                    type(b).__name__ == "OptimizedModule" for b in model.layers.values()),
                titan_world_size=world, titan_fsdp=parallel_dims.fsdp_enabled,
                titan_mixed_precision="%s params, %s" % (jc.training.dtype, (
                    "torch.autocast(%s, %s)" % (amp.device, amp.fast_dtype)) if isinstance(amp, torch.autocast)
                    else type(amp).__name__),
                titan_tied_embeddings=tied, linear_types=sorted({type(m).__name__ for m in model.modules()
                                                                 if "Linear" in type(m).__name__}))
    if s["tied"] and not tied:
        info["titan_note"] = "torchtitan 0.2.2's Llama 3 has no weight tying: lm_head (output) is untied"
    if jc.model.converters:
        f8 = jc.quantize.linear.float8
        info.update(float8_recipe=f8.recipe_name or "tensorwise",
                    float8_fsdp_all_gather=f8.enable_fsdp_float8_all_gather,
                    float8_filter_fqns=list(tt["float8_filter"]),
                    float8_emulate=f8.emulate, float8_linears=sum(type(m).__name__ == "Float8Linear"
                                                                  for m in model.modules()))
        if not info["float8_linears"]:
            raise RuntimeError("float8 conversion did not happen: %s" % info["linear_types"])

    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    impl = "foreach" if cpu else jc.optimizer.implementation  # torchtitan's default: fused
    opt = torch.optim.AdamW(groups, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"], **{impl: True})
    info["optimizer_impl"] = impl
    gen = torch.Generator(device=device)
    gen.manual_seed(spec["seed"] + 1000 * int(os.environ["RANK"]))  # each rank its own tokens
    sync = (lambda: None) if cpu else torch.cuda.synchronize

    def train_step(step_no):
        gc_handler.run(step_no)
        # torchtitan's dataloader gives T+1 tokens per sequence as inputs and next-token labels; here
        # random tokens, one document per sequence (no eos), for each micro-batch
        seqs = [torch.randint(0, s["vocab"], (B, T + 1), device=device, generator=gen) for _ in range(accum)]
        micro = [(x[:, :-1].contiguous(), x[:, 1:].contiguous()) for x in seqs]
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)  # Trainer.train_step: optimizers.zero_grad() first
        global_valid_tokens = sum((labels != IGNORE_INDEX).sum() for _, labels in micro).float()
        if parallel_dims.dp_enabled:  # its Trainer.train_step: the step's tokens over the data-parallel ranks
            global_valid_tokens = dist_utils.dist_sum(global_valid_tokens, parallel_dims.get_mesh("batch"))
        losses = []
        for inputs, labels in micro:  # Trainer.forward_backward_step, non-PP
            extra = {}
            if model_args.attn_type in ("flex", "varlen"):  # post_dataloading_process
                extra["attention_masks"] = model.get_attention_masks(input_batch=inputs, tokenizer=None)
            with train_context():
                with amp:
                    pred = model(inputs, **extra)
                    loss = loss_fn(pred, labels) / global_valid_tokens
                del pred
                loss.backward()
            losses.append(loss.detach())
        dist_utils.clip_grad_norm_(params, jc.training.max_norm, foreach=True, pp_mesh=None, ep_enabled=False)
        opt.step()
        converters.post_optimizer_hook([model])  # float8: precomputes FSDP scales when enabled (not here)
        loss = torch.sum(torch.stack(losses))
        sync()
        return time.perf_counter() - t0, loss.item()

    losses, warm_s = [], []
    for i in range(spec["warmup"]):
        dt, l = train_step(i + 1)
        warm_s.append(dt)
        losses.append(l)
    if not cpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(spec["steps"]):
        dt, l = train_step(spec["warmup"] + i + 1)
        times.append(dt)
        losses.append(l)
    if not all(math.isfinite(l) for l in losses):
        raise RuntimeError("non-finite loss: %s" % losses)
    ms = [t * 1e3 for t in times]
    med = quantile(ms, 0.5)
    info.update(status="ok", **step_times(ms),
                tokens_per_s=accum * B * T / (med / 1e3), n_timed_steps=len(times), loss_first=losses[0],
                loss_last=losses[-1], warmup_ms=[round(t * 1e3, 1) for t in warm_s],
                step_ms_all=[round(t, 2) for t in ms])
    if not cpu:
        free_b, total_b = torch.cuda.mem_get_info()
        info.update(peak_mem_gib=torch.cuda.max_memory_allocated() / GIB,
                    reserved_gib=torch.cuda.max_memory_reserved() / GIB, device_mem_gib=(total_b - free_b) / GIB,
                    gpu_mem_total_gib=total_b / GIB)
    return info


# ---------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["llama3.2-1b"], choices=sorted(MODELS))
    p.add_argument("--layers", type=int, default=None,
                   help="cut the model to this many layers (default: 16 for llama3.2-1b, 8 for llama3.1-8b-cut, "
                        "the most that leaves HF room to train at T=2048 and beyond; train_llama gets --n-layer)")
    p.add_argument("--systems", nargs="+", default=list(DEFAULT_SYSTEMS), choices=ALL_SYSTEMS,
                   help="default: %s (the titan_* systems only when named)" % " ".join(DEFAULT_SYSTEMS))
    p.add_argument("--seq-lens", nargs="*", type=int, default=list(DEFAULT_SEQ_LENS), help="T at B=1")
    p.add_argument("--batch-sweep", nargs="*", type=int, default=list(DEFAULT_BATCH_SWEEP),
                   help="B at T=--batch-t (e.g. 1 2 4 8 16 for the largest B that fits)")
    p.add_argument("--batch-t", type=int, default=2048)
    p.add_argument("--compile-seq-lens", nargs="*", type=int, default=None,
                   help="T at B=1 for hf_sdpa_compile and titan_* (default: only --batch-t: each compile run "
                        "costs ~1 min of compilation on the 1B, so the default sweep is trimmed to keep the run "
                        "short)")
    p.add_argument("--compile-batch-sweep", nargs="*", type=int, default=None,
                   help="B at --batch-t for hf_sdpa_compile and titan_* (default: the largest of --batch-sweep)")
    p.add_argument("--compile-full", action="store_true",
                   help="hf_sdpa_compile and titan_* get the same --seq-lens and --batch-sweep as the others")
    p.add_argument("--train-llama-recompute", nargs="+", type=int, default=[1], choices=[0, 1, 2, 3])
    p.add_argument("--steps", type=int, default=5, help="timed steps (>= 5; the median is reported)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--compile-warmup", type=int, default=3)
    p.add_argument("--timeout", type=int, default=420, help="seconds per run")
    p.add_argument("--budget-s", type=float, default=540,
                   help="per model: skip runs that would end after this many seconds (0 = no budget)")
    p.add_argument("--gpu-mem-gib", type=float, default=79.0, help="for the rough OOM guesses of the plan only")
    p.add_argument("--out", default=os.path.join(REPO, "dev/bench/results/e2e.jsonl"))
    p.add_argument("--mirror", default=None, help="also append every record here (e.g. $OUT/results/e2e.jsonl)")
    p.add_argument("--logs-dir", default=None, help="per-run logs (default: logs/ next to --out)")
    p.add_argument("--train-llama", default="./train_llama")
    p.add_argument("--llmq", default=os.path.join(REPO, ".carry", "llmq"), help="llmq's install (bin/train)")
    p.add_argument("--grad-accum", type=int, default=1,
                   help="micro-steps per optimizer step, for every system (tokens/s counts all of them)")
    p.add_argument("--titan-attn", default="sdpa", choices=["sdpa", "flex"],
                   help="torchtitan's attn_type (default sdpa, its Llama 3 flavors' default; flex: its "
                        "FlexAttentionWrapper with a causal mask, compiled with max-autotune)")
    p.add_argument("--titan-ac", default="none", choices=["none", "selective", "full"],
                   help="torchtitan activation_checkpoint.mode (default none, as the HF systems; torchtitan's own "
                        "default is selective)")
    p.add_argument("--titan-float8-filter", nargs="*", default=["output"],
                   help="quantize.linear.float8.filter_fqns: modules kept in bf16 (default output, the lm_head, as "
                        "torchtitan's Llama 3 8B config; 'auto_filter_small_kn' is torchao's size filter; "
                        "empty: convert all)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--series", default=None,
                   help="a name stamped on every record: report.py gives a series its own tables (e.g. the runs of "
                        "one lease that re-measure some rows of an older table)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--expandable-segments", action="store_true",
                   help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for the HF and torchtitan runs "
                        "(recorded)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: llama3.2-1b cut to 2 layers, T=2048 at B=1 and 2, no budget, "
                        "--out dev/bench/results/e2e_quick.jsonl unless given")
    p.add_argument("--dry-run", action="store_true", help="print the plan and estimates; imports no torch")
    p.add_argument("--verbose", action="store_true", help="with --dry-run: the train_llama command lines")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.models = ["llama3.2-1b"] if "--models" not in argv else args.models
        args.layers = args.layers or 2
        args.seq_lens = [2048] if "--seq-lens" not in argv else args.seq_lens
        args.batch_sweep = [2] if "--batch-sweep" not in argv else args.batch_sweep
        args.budget_s = 0 if "--budget-s" not in argv else args.budget_s
        if "--out" not in argv:
            args.out = os.path.join(REPO, "dev/bench/results/e2e_quick.jsonl")
    if args.compile_full:
        args.compile_seq_lens, args.compile_batch_sweep = list(args.seq_lens), list(args.batch_sweep)
    if args.compile_seq_lens is None:
        args.compile_seq_lens = [args.batch_t] if args.batch_t in args.seq_lens else list(args.seq_lens)
    if args.compile_batch_sweep is None:
        args.compile_batch_sweep = [max(args.batch_sweep)] if args.batch_sweep else []
    if args.steps < 5:
        p.error("--steps must be >= 5 (the median of at least 5 timed steps)")
    if args.warmup < 1 or args.compile_warmup < 1:
        p.error("--warmup and --compile-warmup must be >= 1")
    if any(t <= 0 for t in args.seq_lens + args.batch_sweep) or args.batch_t <= 0:
        p.error("sequence lengths and batch sizes must be positive")
    if args.grad_accum < 1:
        p.error("--grad-accum must be >= 1")
    if args.layers is not None and args.layers <= 0:
        p.error("--layers must be positive")
    if not args.seq_lens and not args.batch_sweep:
        p.error("nothing to run: empty --seq-lens and --batch-sweep")
    return args


def main(argv):
    if "--probe" in argv:
        child_probe()
        return 0
    if "--child" in argv:
        child_main(json.loads(argv[argv.index("--child") + 1]))
        return 0
    return main_parent(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
