"""dev/bench/bench_e2e.py names the first error of a failed llmq run: the text scripts/build_llmq.sh's patch
prints where llmq's worker thread catches it, and, where CUDA graphs hid it behind the allocator's
cudaErrorStreamCaptureUnsupported, the error of one repeat without graphs (seen 2026-11-27: llmq's FP8 failed
in cuBLAS, and the tables said only that the capture had failed)."""
import argparse
import os
import stat
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev", "bench"))
import bench_e2e  # noqa: E402

CAPTURE = ("terminate called after throwing an instance of 'cuda_error'\n  what():  Cuda Error in allocator.cpp:139 "
           "(cudaDeviceSynchronize()): cudaErrorStreamCaptureUnsupported: operation not permitted when stream is "
           "capturing")


def stand_in_llmq(tmp_path, without_graphs):
    """A program that fails as llmq did with --use-cuda-graphs, and runs the shell line given without them."""
    path = tmp_path / "train"
    path.write_text("#!/usr/bin/env bash\n"
                    "for a in \"$@\"; do [ \"$a\" = --use-cuda-graphs ] && { echo \"%s\" >&2; exit 134; }; done\n"
                    "%s\n" % (CAPTURE.replace("'", "'\\''").replace('"', '\\"'), without_graphs))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return [str(path), "--steps=2", "--use-cuda-graphs"]


def failure(tmp_path, without_graphs):
    cmd = stand_in_llmq(tmp_path, without_graphs)
    rc, out, err = bench_e2e.run_subprocess(cmd, 30, str(tmp_path / "run"))
    assert rc == 134
    status = "failed: " + bench_e2e.last_error_line(out + "\n" + err)
    assert "cudaErrorStreamCaptureUnsupported" in status
    return bench_e2e.llmq_failure(argparse.Namespace(timeout=30), cmd, status, out + "\n" + err,
                                  str(tmp_path / "run"))


def test_the_error_graphs_hide_comes_from_a_run_without_them(tmp_path):
    status = failure(tmp_path, "echo 'Thread 0: uncaught exception: cuBLAS ERROR (15) at matmul.cpp:140' >&2; "
                               "echo 'Thread 0 exited with uncaught exception' >&2; exit 134")
    assert status.startswith("failed: cuBLAS ERROR (15) at matmul.cpp:140 (without CUDA graphs; with them: ")
    assert "cudaErrorStreamCaptureUnsupported" in status


def test_a_run_that_trains_without_graphs_says_so(tmp_path):
    status = failure(tmp_path, "exit 0")
    assert status.endswith("(without CUDA graphs it trains)") and "cudaErrorStreamCaptureUnsupported" in status


def test_a_caught_error_is_named_without_a_repeat(tmp_path):
    # no graphs in the command: nothing is repeated, the printed exception is the status
    text = "Thread 0: uncaught exception of type N4llmq9some_errorE\nThread 0 exited with uncaught exception"
    status = bench_e2e.llmq_failure(argparse.Namespace(timeout=30), ["/nonexistent/train"], "failed: x", text,
                                    str(tmp_path / "run"))
    assert status == "failed: N4llmq9some_errorE"
    assert bench_e2e.llmq_failure(argparse.Namespace(timeout=30), ["/nonexistent/train"], "OOM", "",
                                  str(tmp_path / "run")) == "OOM"


def test_each_llmq_run_checkpoints_into_its_own_folder(tmp_path):
    """llmq's default checkpoint folder (ckpt/<name> in the working directory) is one path for every run: two
    benches side by side on two GPUs (2026-11-27) both renamed into it and one failed after training."""
    args = argparse.Namespace(llmq=str(tmp_path / "llmq"))
    dirs = []
    for t in (1024, 2048):
        run = {"system": "llmq", "shape": {"llmq": "qwen2.5-1.5b"}, "T": t, "B": 32768 // t, "accum": 16,
               "warmup": 1, "steps": 5}
        inputs = str(tmp_path / ("inputs_T%d" % t))
        cmd = bench_e2e.llmq_cmd(args, run, inputs, str(tmp_path / "log.json"))
        ckpt = [c.split("=", 1)[1] for c in cmd if c.startswith("--checkpoint-dir=")]
        assert len(ckpt) == 1 and ckpt[0].startswith(inputs + os.sep)
        dirs.append(ckpt[0])
    assert dirs[0] != dirs[1]
