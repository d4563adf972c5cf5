"""dev/bench/bench_multi_gpu.py without GPUs: the launch commands it builds, and what it reads back from
train_llama's rank-0 log and torchtitan's RESULT lines (the same step arithmetic as bench_e2e.py)."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev", "bench"))
import bench_multi_gpu as mg  # noqa: E402


def run_of(args, system, gpus, tmp_path):
    run = mg.run_spec(args, system, gpus)
    run["log"] = str(tmp_path / system)
    return run


def test_the_commands(tmp_path):
    args = mg.parse_args(["--gpus", "4", "--accum", "2"])
    cmd = mg.command(args, run_of(args, "train_llama_fp8_z2", 4, tmp_path))
    assert cmd[:3] == ["mpirun", "-np", "4"] and "--fp8" in cmd
    assert cmd[cmd.index("--zero-stage") + 1] == "2" and cmd[cmd.index("--n-layer") + 1] == "32"
    # the step's tokens over all GPUs: 4 GPUs x 2 micro-steps x 1 x 8192
    assert cmd[cmd.index("--total-batch") + 1] == str(4 * 2 * 8192)
    cmd = mg.command(args, run_of(args, "titan_hsdp_float8", 4, tmp_path))
    assert cmd[cmd.index("--nproc-per-node") + 1] == "4"
    spec = json.loads(cmd[cmd.index("--child") + 1])
    assert spec["system"] == "titan_float8_tensorwise" and spec["titan"]["dp_replicate"] == 2 and spec["accum"] == 2


def test_train_llama_per_gpu_tokens_from_its_log(tmp_path):
    args = mg.parse_args(["--gpus", "2", "--steps", "3", "--warmup", "1"])
    run = run_of(args, "train_llama_z1", 2, tmp_path)
    steps = [dict(step=i + 1, loss=12.0 - i, ms=ms, mfu=0.6, peak_mem_gib=50.0 + i, device_mem_gib=60.0)
             for i, ms in enumerate([5000.0, 800.0, 1000.0, 900.0])]
    with open(run["log"] + ".jsonl", "w") as f:
        f.write(json.dumps({"run": {"commit": "x"}}) + "\n" + "".join(json.dumps(s) + "\n" for s in steps))
    res = mg.result_of(args, run, 0, "", "")
    assert res["status"] == "ok" and res["step_ms_median"] == 900.0  # the warm-up step left out
    assert abs(res["tokens_per_s"] - 8192 / 0.9) < 1e-6 and res["peak_mem_gib"] == 53.0
    assert mg.result_of(args, run, "timeout", "", "")["status"].startswith("timeout")


def test_torchtitan_results_a_failure_wins(tmp_path):
    args = mg.parse_args(["--gpus", "2"])
    run = run_of(args, "titan_fsdp", 2, tmp_path)
    ok = 'RESULT {"status": "ok", "tokens_per_s": 5000.0}'
    assert mg.result_of(args, run, 0, ok, "")["tokens_per_s"] == 5000.0
    bad = 'RESULT {"status": "failed: RuntimeError: boom"}'
    assert mg.result_of(args, run, 0, ok + "\n" + bad, "")["status"] == "failed: RuntimeError: boom"
    assert mg.result_of(args, run, 1, "", "torch.OutOfMemoryError: CUDA out of memory")["status"] == "OOM"
    assert mg.result_of(args, run, "timeout", "", "")["status"].startswith("timeout")


def test_another_recompute_level_gets_its_own_logs(tmp_path, capsys):
    """--recompute 2 (memory against torchtitan's selective checkpointing): train_llama's command and log names say
    it, so its rows neither overwrite the default's logs nor read them; torchtitan's command does not take it."""
    assert mg.main(["--gpus", "4", "--recompute", "2", "--systems", "train_llama_fp8_z3", "titan_fsdp",
                    "--logs-dir", str(tmp_path), "--dry-run"]) == 0
    mine, theirs = capsys.readouterr().out.strip().splitlines()
    assert "--recompute 2" in mine and "train_llama_fp8_z3_llama3.1-8b-cut_L32_4gpu_B1_T8192_r2.jsonl" in mine
    assert "recompute" not in theirs and "_r2" not in theirs


def test_a_run_writes_its_record(tmp_path, monkeypatch, capsys):
    """main's whole path past the launch (the launcher and the environment probe faked): the record is made with
    bench_e2e's make_record and appended to --out. Its arguments once lacked a field make_record reads (series), and
    every run died after it had trained."""
    monkeypatch.setattr(mg.e2e, "probe_env", lambda args: {"gpu": "fake"})
    monkeypatch.setattr(mg.e2e, "run_subprocess",
                        lambda cmd, timeout, log, env=None: (0, 'RESULT {"status": "ok", "tokens_per_s": 5000.0}', ""))
    out = tmp_path / "peers.jsonl"
    assert mg.main(["--gpus", "2", "--systems", "titan_fsdp", "--logs-dir", str(tmp_path), "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["system"] == "titan_fsdp" and rec["gpus"] == 2 and rec["tokens_per_s_per_gpu"] == 5000.0
    assert rec["tokens_per_s"] == 10000.0 and "series" not in rec
