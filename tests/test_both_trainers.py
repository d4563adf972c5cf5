"""The same flags through both trainers, which share their run (llmc/run/train_loop.h): the same steps logged with the
same skips (masked windows), evaluations and checkpoints at the same steps, a resume from the same step, losses
within what bf16 against fp32 allows, and the same files written. Needs a GPU for train_llama (skipped without)."""
import json
import os
import subprocess

import numpy as np
import pytest

from test_no_targets import data  # noqa: F401  (the fixture: a model, masked shards)
from test_on_nan import have_gpu, run

pytestmark = pytest.mark.skipif(not (os.path.exists(os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "train_llama")) and have_gpu()), reason="train_llama and a GPU")


def records(log):
    return [json.loads(line) for line in open(log)]


def test_the_same_flags_give_the_same_run(data):  # noqa: F811
    tmp, common = data
    logs = {}
    for bin in ("train_llama_ref", "train_llama"):
        ck = tmp / f"ck_{bin}"
        args = [*common, "--train", tmp / "ft_train_*.bin", "--val", tmp / "ft_val_*.bin", "--eval-every", 5,
                "--eval-batches", 40, "--checkpoint-dir", ck, "--save-every", 5, "--keep", 0, "--steps", 12]
        r = run(bin, *args, "--log", tmp / f"{bin}.jsonl", allow_nonfinite=False)
        assert r.returncode == 0, r.stderr
        subprocess.run(["rm", "-r", str(ck / "step_00000010"), str(ck / "step_00000012")], check=True)
        r = run(bin, *args, "--log", tmp / f"{bin}.jsonl", "--resume", allow_nonfinite=False)
        assert r.returncode == 0 and "at step 5" in r.stdout, r.stderr
        logs[bin] = (records(tmp / f"{bin}.jsonl"), sorted(os.listdir(ck / "step_00000012")))
    (cpu, cpu_files), (gpu, gpu_files) = logs["train_llama_ref"], logs["train_llama"]
    shape = [(("step" in r and r["step"]), "val_loss" in r, bool(r.get("no_targets")), "run" in r) for r in cpu]
    assert shape == [(("step" in r and r["step"]), "val_loss" in r, bool(r.get("no_targets")), "run" in r)
                     for r in gpu]
    assert cpu_files == gpu_files
    # bf16 weights and activations on the GPU against fp32: the losses of a few steps agree to a few 1e-3
    pairs = [(c["loss"], g["loss"]) for c, g in zip(cpu, gpu) if c.get("loss") is not None]
    pairs += [(c["val_loss"], g["val_loss"]) for c, g in zip(cpu, gpu) if "val_loss" in c]
    assert pairs and max(abs(c - g) / abs(c) for c, g in pairs) < 2e-2, pairs
    assert np.all(np.isfinite([p for pair in pairs for p in pair]))
