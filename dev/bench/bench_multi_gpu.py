#!/usr/bin/env python3
"""train_llama's ZeRO stages against torchtitan's FSDP2 and HSDP on several GPUs of one host, side by side.

The same model shape, B x T per GPU, micro-steps, AdamW settings and fresh random tokens on every rank for
every system (dev/bench/bench_e2e.py's shapes and optimizer): train_llama under mpirun at each ZeRO stage,
bf16 and --fp8; torchtitan 0.2.2 (wheels from .whl/, as bench_e2e.py's titan systems) under torchrun with
FSDP2 over all GPUs, or HSDP (2 replicas, each sharded over half), torch.compile, bf16 or float8 tensorwise
(its FSDP float8 all-gather and precomputed scales). Per GPU: tokens/s (the median step), MFU (6N + 12 L H D T
FLOPs per token, N without the input embedding, against 989 TFLOP/s) and peak memory. One record per run in
--out (default dev/bench/results/multi_gpu_peers.jsonl); report.py turns them into a table.

  python3 dev/bench/bench_multi_gpu.py --gpus 4                        # the 8B, T=8192, every system
  python3 dev/bench/bench_multi_gpu.py --gpus 2 --systems titan_fsdp train_llama_z3 --dry-run
  BENCH_TITAN_CPU=1 python3 dev/bench/bench_multi_gpu.py --gpus 2 --systems titan_fsdp --layers 1 -T 64  # smoke
"""
import argparse
import json
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_e2e as e2e  # noqa: E402

# system -> (ZeRO stage, --fp8) for train_llama; (replicas, float8 recipe or None) for torchtitan
TRAIN_LLAMA = {"train_llama_z%d" % z: (z, False) for z in (1, 2, 3)}
TRAIN_LLAMA.update({"train_llama_fp8_z%d" % z: (z, True) for z in (1, 2, 3)})
TITAN = {"titan_fsdp": (1, None), "titan_hsdp": (2, None), "titan_fsdp_float8": (1, "tensorwise"),
         "titan_hsdp_float8": (2, "tensorwise")}
SYSTEMS = list(TRAIN_LLAMA) + list(TITAN)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, nargs="+", default=[4], help="GPUs per run (each count a run per system)")
    p.add_argument("--model", default="llama3.1-8b-cut", choices=sorted(e2e.MODELS))
    p.add_argument("--layers", type=int, default=None, help="default: the whole model (32 layers for the 8B)")
    p.add_argument("-B", type=int, default=1, help="sequences per GPU per micro-step")
    p.add_argument("-T", type=int, default=8192)
    p.add_argument("--accum", type=int, default=1, help="micro-steps per optimizer step")
    p.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS)
    p.add_argument("--recompute", type=int, default=1, help="train_llama's --recompute")
    p.add_argument("--titan-ac", default="selective", choices=["none", "selective", "full"],
                   help="torchtitan's activation checkpointing (selective: its default for the 8B)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--out", default=os.path.join(e2e.REPO, "dev/bench/results/multi_gpu_peers.jsonl"))
    p.add_argument("--logs-dir", default="/tmp/bench_multi_gpu")
    p.add_argument("--train-llama", default="./train_llama")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    if args.steps < 3 or args.warmup < 1:
        p.error("--steps 3 or more and --warmup 1 or more: the first steps compile and allocate")
    return args


def run_spec(args, system, gpus):
    """bench_e2e's run dictionary for this system and GPU count."""
    shape = dict(e2e.MODELS[args.model])
    layers = args.layers or shape["layers"]
    shape["layers"] = layers
    return dict(system=system, model=args.model, shape=shape, layers=layers, B=args.B, T=args.T,
                accum=args.accum, warmup=args.warmup, steps=args.steps, recompute=args.recompute, gpus=gpus)


def command(args, run):
    """The launcher's command line for one run."""
    n = run["gpus"]
    if run["system"] in TRAIN_LLAMA:
        stage, fp8 = TRAIN_LLAMA[run["system"]]
        one = dict(run, system="train_llama_fp8" if fp8 else "train_llama", accum=run["accum"] * n)
        # accum x GPUs: train_llama_cmd's --total-batch is the step's tokens over all of them
        cmd = e2e.train_llama_cmd(args, one, run["log"] + ".jsonl") + ["--zero-stage", str(stage)]
        return ["mpirun", "-np", str(n), "--bind-to", "none", "-x", "NCCL_NVLS_ENABLE=0"] + cmd
    replicas, recipe = TITAN[run["system"]]
    titan = dict(attn="sdpa", ac=args.titan_ac, float8_filter=["output"], dp_replicate=replicas)
    spec = dict(system="titan_float8_" + recipe if recipe else "titan_compile", shape=run["shape"], B=run["B"],
                T=run["T"], warmup=run["warmup"], steps=run["steps"], seed=args.seed, optim=e2e.OPTIM,
                accum=run["accum"], titan=titan)
    return [args.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
            os.path.join(e2e.REPO, "dev/bench/bench_e2e.py"), "--child", json.dumps(spec)]


def result_of(args, run, rc, out, err):
    """What the run measured, per GPU, from train_llama's rank-0 log or torchtitan's RESULT lines."""
    if run["system"] in TRAIN_LLAMA:
        return e2e.train_llama_result(args, run, rc, out + "\n" + err, run["log"] + ".jsonl")
    results = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
    failed = [r for r in results if r.get("status") != "ok"]
    if failed or not results:
        if rc == "timeout":
            return {"status": "timeout (%ds)" % args.timeout}
        if failed:
            return failed[0]
        text = out + "\n" + err
        return {"status": "OOM" if e2e.is_oom_text(text) else "failed: %s" % e2e.last_error_line(text)}
    return results[0]


def main(argv):
    args = parse_args(argv)
    os.makedirs(args.logs_dir, exist_ok=True)
    env = {} if args.dry_run else e2e.probe_env(args)
    for gpus in args.gpus:
        for system in args.systems:
            if system in TITAN and TITAN[system][0] > 1 and gpus < 2 * TITAN[system][0]:
                print("skip %-19s %d GPUs: HSDP's replicas need 2 GPUs each (with fewer it is DDP)" % (system, gpus))
                continue
            run = run_spec(args, system, gpus)
            run["log"] = os.path.join(args.logs_dir, "%s_%s_L%d_%dgpu_B%d_T%d%s" % (
                system, args.model, run["layers"], gpus, args.B, args.T,
                "_r%d" % args.recompute if system in TRAIN_LLAMA and args.recompute != 1 else ""))
            cmd = command(args, run)
            if args.dry_run:
                print(" ".join(shlex.quote(c) for c in cmd))
                continue
            if os.path.exists(run["log"] + ".jsonl"):
                os.remove(run["log"] + ".jsonl")
            print("run %-20s %d GPUs ... " % (system, gpus), end="", flush=True)
            env_run = dict(os.environ, NCCL_NVLS_ENABLE="0")
            rc, out, err = e2e.run_subprocess(cmd, args.timeout, run["log"], env=env_run)
            res = result_of(args, run, rc, out, err)
            one = dict(run, system=system)
            rec = e2e.make_record(args_for_record(), one, env, res, 0.0)
            rec.update(gpus=gpus, command=" ".join(shlex.quote(c) for c in cmd), tokens_per_s_per_gpu=rec[
                "tokens_per_s"], tokens_per_s=rec["tokens_per_s"] * gpus if rec["tokens_per_s"] else None)
            if system in TRAIN_LLAMA:
                rec.update(zero_stage=TRAIN_LLAMA[system][0], fp8=TRAIN_LLAMA[system][1])
            else:
                rec.update(titan_replicas=TITAN[system][0], float8=TITAN[system][1], titan_ac=args.titan_ac)
            e2e.append_record(rec, [args.out])
            print(e2e.cell(dict(rec, tokens_per_s=rec["tokens_per_s_per_gpu"])))
    return 0


def args_for_record():
    """The arguments make_record reads (expandable_segments, series, ...): bench_e2e's own defaults, so that a field
    it comes to read is there without a copy of it here (a hand-made copy once lacked series)."""
    return e2e.parse_args([])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
