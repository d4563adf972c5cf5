"""Fine-tuning data whose windows can hold no target: a long prompt (masked) and a short completion, so that a
window of -B 1 -T 16 inside the prompt has every target masked. Such a step has nothing to learn: both trainers
count it, skip its update (the weights and AdamW state stay) and go on, on a fresh run and on every --resume
(the CPU trainer used to stop with "step 2 has no target to learn from", again on each resume; the GPU trainer
stepped with 1/count = 0). A val set whose evaluated batches hold no target ends the run at its first evaluation
(it used to log a null val loss and exit 0). Runs train_llama_ref, and train_llama where a GPU answers."""
import json
import os
import subprocess
import sys
import types
from array import array

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_hf import ROOT, hf_config, random_tensors, write_dir  # noqa: E402
from test_on_nan import BINS, run  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "data"))
import prepare  # noqa: E402

PROMPT, COMPLETION = 190, 10  # tokens of each example: windows of 16 inside a prompt see only masked targets


def masked_shard(path, examples, seed, all_masked=False):
    rng = np.random.default_rng(seed)
    n = examples * (PROMPT + COMPLETION)
    tokens = array("I", (int(x) for x in rng.integers(3, 300, n)))
    mask = bytearray()
    for _ in range(examples):
        mask += bytes(PROMPT) + bytes([0 if all_masked else 1]) * COMPLETION
    prepare.write_shard(str(path), tokens, types.SimpleNamespace(vocab_size=300, bos_id=1, eos_id=2), mask)


@pytest.fixture
def data(tmp_path):
    src = write_dir(tmp_path / "hf", hf_config(), random_tensors(hf_config(), seed=5))
    masked_shard(tmp_path / "ft_train_000000.bin", 40, seed=1)
    masked_shard(tmp_path / "ft_val_000000.bin", 10, seed=2)
    masked_shard(tmp_path / "empty_val_000000.bin", 10, seed=3, all_masked=True)
    return tmp_path, ["--init-from", src, "-B", 1, "-T", 16, "--lr", "1e-3", "--warmup", 0]


def steps_of(log):
    return [json.loads(line) for line in open(log) if '"loss"' in line]


@pytest.mark.parametrize("bin", BINS)
def test_steps_without_targets_are_skipped_and_the_run_goes_on(data, bin):
    tmp, common = data
    log = tmp / "log.jsonl"
    ck = tmp / "ck"
    args = [*common, "--train", tmp / "ft_train_*.bin", "--val", tmp / "ft_val_*.bin", "--eval-every", 10,
            "--eval-batches", 40, "--checkpoint-dir", ck, "--save-every", 5, "--keep", 0, "--steps", 20]
    r = run(bin, *args, "--log", log, allow_nonfinite=False)
    assert r.returncode == 0, r.stderr
    steps = steps_of(log)
    empty = [s for s in steps if s.get("no_targets")]
    learned = [s for s in steps if not s.get("no_targets")]
    assert len(steps) == 20 and empty and learned, steps
    assert all(s["skipped"] and s["loss"] is None for s in empty), empty
    assert all(np.isfinite(s["loss"]) and not s.get("skipped") for s in learned), learned
    assert f"{len(empty)} step{'s' if len(empty) > 1 else ''} had no target to learn from" in r.stdout, r.stdout
    assert "skipped: no targets (all masked)" in r.stdout
    # resumed from step 5, the run goes on through such steps and gives the uninterrupted run's losses
    for later in ("step_00000010", "step_00000015", "step_00000020"):
        subprocess.run(["rm", "-r", str(ck / later)], check=True)
    r = run(bin, *args, "--log", tmp / "resumed.jsonl", "--resume", allow_nonfinite=False)
    assert r.returncode == 0, r.stderr
    resumed = steps_of(tmp / "resumed.jsonl")
    assert [s["step"] for s in resumed] == list(range(6, 21)), resumed
    assert any(s.get("no_targets") for s in resumed), resumed
    assert [s["loss"] for s in resumed] == [s["loss"] for s in steps[5:]]


@pytest.mark.parametrize("bin", BINS)
def test_a_val_set_without_targets_is_an_error(data, bin):
    tmp, common = data
    r = run(bin, *common, "--train", tmp / "ft_train_*.bin", "--val", tmp / "empty_val_*.bin", "--steps", 3,
            "--eval-batches", 4, "--log", "", allow_nonfinite=False)
    assert r.returncode != 0
    assert "the first 4 val batches (--eval-batches) of" in r.stderr and "hold no target" in r.stderr, r.stderr
    assert "step     1/" not in r.stdout, r.stdout
