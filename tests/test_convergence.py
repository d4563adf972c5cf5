"""dev/bench/convergence.sh without a GPU: LAUNCH puts a stand-in in front of ./train_llama that writes the log a
run would (a loss curve shifted by the variant's --stand-in-shift), so the script's flags, outputs and verdicts
are checked here; the real runs are on the GPU (dev/bench/fp8_convergence.sh, multi_gpu_check.sh qconvergence)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STAND_IN = r"""
import json, sys
args = sys.argv[2:]  # sys.argv[1] is ./train_llama
def flag(name, default=None):
    return args[args.index(name) + 1] if name in args else default
shift = float(flag("--stand-in-shift", "0"))
assert flag("--train", "").endswith("/corpus_train_*.bin") and flag("--seed") == "1337", args
with open(flag("--log"), "w") as f:
    for step in range(1, int(flag("--steps")) + 1):
        f.write(json.dumps({"step": step, "loss": (4.0 - step / 1000.0) * (1 + shift), "tokens_per_s": 1000.0}) + "\n")
        if step % 100 == 0:
            f.write(json.dumps({"step": step, "val_loss": 4.5 * (1 + 2 * shift)}) + "\n")
print("stand-in run done", flag("--stand-in-shift"))
"""


def run(tmp_path, *variants, val_tol="-"):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "corpus_train_000.bin").write_bytes(b"")
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(STAND_IN)
    env = dict(os.environ, LAUNCH=f"{sys.executable} {stand_in}", DATA=str(data), OUT=str(tmp_path / "out"),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    p = subprocess.run(["bash", "dev/bench/convergence.sh", "t", "300", "0.005", val_tol, *variants], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    return p, tmp_path / "out"


def test_variants_within_the_tolerance_pass_and_leave_runs_plot_and_summary(tmp_path):
    p, out = run(tmp_path, "base=", "near=--stand-in-shift 0.001", "near2=--stand-in-shift -0.002", val_tol="0.005")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("PASS") == 4 and "FAIL" not in p.stdout
    res = json.load(open(out / "t.json"))
    assert set(res) == {"base", "near", "near2"}
    assert abs(res["near"]["loss_rel_diff"] - 0.001) < 1e-9 and abs(res["near2"]["val_rel_diff"] + 0.004) < 1e-9
    assert (out / "t.png").stat().st_size > 0 and (out / "t_near2.jsonl").exists()


def test_a_variant_past_the_tolerance_fails_the_run(tmp_path):
    p, out = run(tmp_path, "base=", "far=--stand-in-shift 0.02")
    assert p.returncode == 1
    assert "FAIL far: train loss within 0.5% of base's over the last 100 steps: +2.000%" in p.stdout


def test_the_val_tolerance_is_checked_on_its_own(tmp_path):
    # train loss 0.3% off (within 0.5%), val loss 0.6% off: only the val check fails
    p, _ = run(tmp_path, "base=", "valoff=--stand-in-shift 0.003", val_tol="0.005")
    assert p.returncode == 1
    assert "PASS valoff: train loss" in p.stdout and "FAIL valoff: last val loss within 0.5%" in p.stdout


def test_bad_arguments_are_refused(tmp_path):
    p, _ = run(tmp_path, "base=", "no_equals_sign")
    assert p.returncode == 2 and "'no_equals_sign' is not NAME=FLAGS" in p.stdout
    p = subprocess.run(["bash", "dev/bench/convergence.sh", "t", "300"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and "NAME=FLAGS" in p.stdout
