"""scripts/plot_log.py: a PNG from the logs the CPU trainer writes (one run, two runs overlaid, a log cut short by a
kill), and a clear error, exit 1 and no traceback for a missing log, a log without steps and mismatched --names."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLOT = os.path.join(ROOT, "scripts", "plot_log.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_log(tmp_path, name, seed):
    for split, s in (("train", seed), ("val", seed + 100)):
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "make_random_shard.py"),
                        str(tmp_path / ("d_%s_000000.bin" % split)), "300", "6000", str(s), "1", "2"], check=True)
    log = tmp_path / (name + ".jsonl")
    subprocess.run([os.path.join(ROOT, "train_llama_ref"), "--preset", "nano", "--vocab", "300", "-B", "2", "-T", "32",
                    "--steps", "12", "--warmup", "2", "--eval-every", "5", "--eval-batches", "2", "--seed", str(seed),
                    "--train", str(tmp_path / "d_train_*.bin"), "--val", str(tmp_path / "d_val_*.bin"),
                    "--log", str(log)], check=True, capture_output=True, cwd=ROOT)
    return log


def plot(*args):
    return subprocess.run([sys.executable, PLOT, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


def test_one_and_two_runs_and_a_cut_log(tmp_path):
    a, b = make_log(tmp_path, "a", 1), make_log(tmp_path, "b", 2)
    r = plot(a)
    assert r.returncode == 0, r.stderr
    png = tmp_path / "a.png"
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 20000
    out = tmp_path / "both.png"
    r = plot(a, b, "--names", "first", "second", "--out", out)
    assert r.returncode == 0 and "2 runs" in r.stdout, r.stderr
    assert out.read_bytes()[:8] == PNG_MAGIC
    cut = tmp_path / "cut.jsonl"  # a kill mid-write leaves half a line
    cut.write_text(a.read_text() + '{"step": 13, "loss": 5.1, "l')
    r = plot(cut, "--out", tmp_path / "cut.png")
    assert r.returncode == 0, r.stderr


def test_bad_input(tmp_path):
    r = plot(tmp_path / "missing.jsonl")
    assert r.returncode == 1 and "cannot read the log" in r.stderr and "Traceback" not in r.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"run": {"program": "./train_llama_ref"}}\n')
    r = plot(empty)
    assert r.returncode == 1 and "holds no training steps" in r.stderr and "Traceback" not in r.stderr
    r = plot(empty, empty, "--names", "only-one")
    assert r.returncode == 1 and "--names gives 1 names for 2 logs" in r.stderr
