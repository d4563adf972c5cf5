"""dev/bench/bench_e2e.py's runs live in their own session (so that a timeout ends the helpers they leave
behind); a time limit around the whole bench must still end them, or the run holds its GPU's memory and the
next bench on that GPU runs out of it (seen 2026-11-27: an outer `timeout` killed bench_e2e, llmq kept running)."""
import os
import signal
import subprocess
import sys
import time

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev", "bench")


def pids_running(marker):
    """The processes whose command line holds marker (from /proc: no procps needed)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if marker.encode() in f.read().replace(b"\0", b" "):
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


def test_an_outer_time_limit_ends_the_run_and_its_helpers(tmp_path):
    marker = "sleep 47.%d" % os.getpid()  # a command line no other process has
    script = ("import sys; sys.path.insert(0, %r); import bench_e2e; "
              "bench_e2e.run_subprocess(['bash', '-c', '%s & %s'], 60, %r)"
              % (BENCH, marker, marker, str(tmp_path / "run")))
    try:
        rc = subprocess.run(["timeout", "3", sys.executable, "-c", script]).returncode
        assert rc == 124  # the outer limit, not the run's own
        time.sleep(0.5)
        assert not pids_running(marker), "the run outlived the bench"
    finally:
        for pid in pids_running(marker):
            os.kill(pid, signal.SIGKILL)
