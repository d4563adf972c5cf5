"""--on-nan: a step whose loss or gradient norm is not finite never reaches the weights. A NaN planted in one
weight of an HF directory makes every step's loss NaN; then --on-nan stop ends the run at step 1, skip (the
default) skips updates until --max-skips in a row, and no checkpoint or export is written with the NaN in it.
Runs train_llama_ref, and train_llama where it was built and a GPU answers, also with --offload optimizer (AdamW on
the host: the skipped update must not be written there either)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_hf import ROOT, hf_config, random_tensors, write_dir  # noqa: E402


def have_gpu():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    except OSError:
        return False


BINS = [b for b in ("train_llama_ref", "train_llama") if os.path.exists(os.path.join(ROOT, b))
        and (b == "train_llama_ref" or have_gpu())]
BINS += ["train_llama+offload"] if "train_llama" in BINS else []  # the binary, then its flags
VARIANT_FLAGS = {"offload": ["--offload", "optimizer"]}


@pytest.fixture
def nan_model(tmp_path):
    c = hf_config()
    named = random_tensors(c, seed=3)
    named["model.norm.weight"][5] = np.nan
    src = write_dir(tmp_path / "hf", c, named)
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "make_random_shard.py"),
                    str(tmp_path / "d_train_000000.bin"), "300", "4000", "4", "1", "2"], check=True)
    return ["--init-from", src, "-B", 2, "-T", 16, "--val", "", "--train", tmp_path / "d_train_*.bin"]


def run(bin, *args, allow_nonfinite=True):
    """The trainers refuse non-finite --init-from weights (test_nonfinite_init_weights_are_refused); the guard's
    tests let the planted NaN through with the loader's test switch."""
    env = dict(os.environ, LLMC_TEST_ALLOW_NONFINITE="1") if allow_nonfinite else None
    name, _, variant = bin.partition("+")
    args = [*args, *VARIANT_FLAGS.get(variant, [])]
    return subprocess.run([os.path.join(ROOT, name), *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                          env=env)


@pytest.mark.parametrize("bin", BINS)
def test_nonfinite_init_weights_are_refused(nan_model, bin):
    """A NaN in --init-from's weights ends the run before any step, naming the tensor (it used to train, skipping
    every step, and exit 0)."""
    r = run(bin, *nan_model, "--steps", 5, "--log", "", allow_nonfinite=False)
    assert r.returncode != 0
    assert "tensor 'model.norm.weight' holds 1 value that is not finite (the first at element 5)" in r.stderr, r.stderr
    assert "step 1" not in r.stdout, r.stdout


@pytest.mark.parametrize("bin", BINS)
def test_stop_ends_the_run_at_the_first_nan(tmp_path, nan_model, bin):
    r = run(bin, *nan_model, "--steps", 5, "--on-nan", "stop", "--log", "", "--checkpoint-dir", tmp_path / "ck",
            "--save-every", 1)
    assert r.returncode != 0
    assert "step 1: loss nan" in r.stderr and "not finite" in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "ck") or not os.listdir(tmp_path / "ck")


@pytest.mark.parametrize("bin", BINS)
def test_skip_counts_and_stops_at_max_skips(tmp_path, nan_model, bin):
    log = tmp_path / "log.jsonl"
    r = run(bin, *nan_model, "--steps", 10, "--max-skips", 3, "--log", log)
    assert r.returncode != 0
    assert "step 3: 3 steps in a row" in r.stderr and "--max-skips 3" in r.stderr, r.stderr
    assert r.stdout.count("skipped: not finite") == 3, r.stdout
    steps = [json.loads(line) for line in open(log) if '"step"' in line and '"loss"' in line]
    assert [s.get("skipped") for s in steps] == [True] * 3, steps


@pytest.mark.parametrize("bin", BINS)
def test_a_nan_weight_is_never_saved(tmp_path, nan_model, bin):
    """The updates were skipped, but the planted NaN is still in the weights: neither the checkpoint nor the
    export may be written (and the run says why)."""
    r = run(bin, *nan_model, "--steps", 2, "--max-skips", 5, "--log", "", "--checkpoint-dir", tmp_path / "ck")
    assert r.returncode != 0
    assert "model.norm.weight' holds a value that is not finite" in r.stderr, r.stderr
    assert not [d for d in os.listdir(tmp_path / "ck") if d.startswith("step_")]
    r = run(bin, *nan_model, "--steps", 2, "--max-skips", 5, "--log", "", "--export", tmp_path / "out")
    assert r.returncode != 0
    assert "model.norm.weight' holds a value that is not finite" in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "out" / "model.safetensors")


@pytest.mark.parametrize("bin", BINS)
def test_bad_on_nan_flags(nan_model, bin):
    for flags, message in ((["--on-nan", "ignore"], "--on-nan takes skip or stop (got 'ignore')"),
                           (["--max-skips", 0], "--max-skips 0 is out of range")):
        r = run(bin, *nan_model, "--steps", 1, "--log", "", *flags)
        assert r.returncode != 0 and message in r.stderr, r.stderr
