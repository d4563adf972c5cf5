"""--offload optimizer on the GPU trainer: the fp32 master weights and AdamW moments in host memory, AdamW on the
CPU (llmc/model/optimizer_offload.h). The host runs the GPU kernel's arithmetic on the same inputs, so every loss is
the same bits as without offload, over micro-steps and across a checkpoint's save and resume in either direction;
what the host cannot hold is refused before any work, naming both sizes. Needs train_llama and a GPU (skipped
otherwise)."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_on_nan import ROOT, have_gpu  # noqa: E402

BIN = os.path.join(ROOT, "train_llama")

pytestmark = pytest.mark.skipif(not (os.path.exists(BIN) and have_gpu()), reason="needs train_llama and a GPU")

SMALL = ["--preset", "tiny", "--vocab", "512", "-B", "4", "-T", "64", "--random-data", "--warmup", "1",
         "--val", "", "--seed", "7", "--schedule", "constant"]


def train(log, *args):
    r = subprocess.run([BIN, *SMALL, "--log", str(log), *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return [json.loads(line)["loss"] for line in open(log) if '"loss"' in line and '"step"' in line]


@pytest.mark.parametrize("extra", [[], ["--total-batch", 512], ["--zero-stage", 3], ["--fp8"], ["--recompute", 3]])
def test_offloaded_losses_are_the_bits_of_adamw_on_the_gpu(tmp_path, extra):
    gpu = train(tmp_path / "gpu.jsonl", "--steps", 6, *extra)
    host = train(tmp_path / "host.jsonl", "--steps", 6, "--offload", "optimizer", *extra)
    assert len(gpu) == 6 and host == gpu, (host, gpu)


@pytest.mark.parametrize("first,then", [("optimizer", "optimizer"), ("none", "optimizer"), ("optimizer", "none")])
def test_a_resume_with_or_without_offload_continues_the_same_bits(tmp_path, first, then):
    """The checkpoint holds the master weights and moments wherever they lived: saved from the host's copies,
    loaded into them, or into the GPU's. A run of 3 steps saves at its end; the constant schedule makes it the
    first half of the run of 6."""
    whole = train(tmp_path / "whole.jsonl", "--steps", 6)
    ck = tmp_path / "ck"
    part = train(tmp_path / "a.jsonl", "--steps", 3, "--checkpoint-dir", ck, "--offload", first)
    rest = train(tmp_path / "b.jsonl", "--steps", 6, "--checkpoint-dir", ck, "--resume", "--offload", then)
    assert part == whole[:3] and rest[-3:] == whole[3:], (part, rest, whole)


def test_what_the_host_cannot_hold_is_refused_before_any_work(tmp_path):
    """The 8B's layer shape 1024 layers deep: 224B parameters, 2.6 TB of master weights and moments."""
    r = subprocess.run([BIN, "--preset", "llama3.1-8b", "--n-layer", "1024", "-B", "1", "-T", "64", "--random-data",
                        "--steps", "1", "--log", "", "--offload", "optimizer"], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode != 0
    assert "--offload optimizer: the fp32 master weights and AdamW moments on the host" in r.stderr, r.stderr
    assert "GiB are available (MemAvailable in /proc/meminfo)" in r.stderr, r.stderr
    assert "step 1" not in r.stdout
