"""Kill loop: a checkpointed training run killed with SIGKILL at random moments (while it starts, resumes, trains
or saves), each time resumed, until it reaches the end. It passes when nothing was lost:
  - after every kill the newest complete checkpoint is at least as new as before (no lost checkpoint);
  - every restarted run either got killed or finished (no failed resume);
  - every step that was logged, by any of the runs, has exactly the loss and gradient norm of an uninterrupted run
    with the same flags, and the final checkpoint's files are byte-identical to that run's but for the run id
    (bytes 112-119 of train_state.bin, llmc/formats/train_state.h), which every start since the last fresh one (one killed
    before its first save starts afresh) logged the same, and the uninterrupted run's differs.
Prints the counts. The CPU trainer by default (make test-kill); scripts/gpu_check.sh runs a shorter one on train_llama.

    python3 tests/kill_loop.py [--bin ./train_llama_ref] [--kills 50] [--steps 800] [--max-delay S] [--seed 1]
                               [-- extra trainer flags]"""
import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def newest_complete(ck):
    steps = [int(os.path.basename(d)[5:]) for d in glob.glob(os.path.join(ck, "step_*"))
             if not d.endswith(".tmp") and os.path.exists(os.path.join(d, "COMPLETE"))]
    return max(steps, default=0)


RUN_ID_BYTES = slice(112, 120)  # of a train_state file


def log_records(log):
    """Every complete JSON line of a log (a run killed mid-line leaves a torn one)."""
    with open(log) as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def run_ids(log):
    """The run ids of the log's run lines (each start appends one) from the last fresh start on."""
    ids = []
    for r in log_records(log):
        if "run" in r:
            ids = (ids if r["run"]["resumed_from"] else []) + [r["run"]["run_id"]]
    return ids


def checkpoint_files(path):
    """{name: (bytes, run id as hex or None)} of a checkpoint directory, a train state's run id set apart."""
    out = {}
    for name in sorted(os.listdir(path)):
        data = open(os.path.join(path, name), "rb").read()
        if name.startswith("train_state"):
            out[name] = (data[:RUN_ID_BYTES.start] + data[RUN_ID_BYTES.stop:], data[RUN_ID_BYTES][::-1].hex())
        elif name == "COMPLETE":  # the manifest: its run line, the train states' checksums and its own name the run
            lines = data.split(b"\n")
            run = next((line[4:].decode() for line in lines if line.startswith(b"run ")), None)
            out[name] = (b"\n".join(line for line in lines
                                    if not line.startswith((b"run ", b"end ")) and b" train_state" not in line), run)
        else:
            out[name] = (data, None)
    return out


def logged_steps(log):
    """{step: [(loss, grad_norm), ...]} of every complete step line."""
    out = {}
    for r in log_records(log):
        if "loss" in r and "grad_norm" in r:
            out.setdefault(r["step"], []).append((r["loss"], r["grad_norm"]))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "train_llama_ref"))
    p.add_argument("--kills", type=int, default=50)
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--max-delay", type=float, default=0.0,
                   help="seconds: each kill comes after 0 to this (default: the time to the first step, plus that of "
                        "half the steps still to go over the kills still to come, at the pace the runs keep)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", type=int, default=2)
    p.add_argument("extra", nargs="*", help="trainer flags (default: a nano model on a random shard)")
    a = p.parse_args()
    rng = random.Random(a.seed)
    tmp = tempfile.mkdtemp(prefix="kill_loop.")
    try:
        train = os.path.join(tmp, "d_train_000000.bin")
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "make_random_shard.py"), train, "512", "200000",
                        "1", "0", "1"], check=True)
        model = a.extra or ["--preset", "nano", "--vocab", "512", "-B", "2", "-T", "32"]
        flags = [a.bin, *model, "--steps", str(a.steps), "--train", os.path.join(tmp, "d_train_*.bin"), "--val", "",
                 "--save-every", "1", "--keep", str(a.keep)]

        ref_ck, ref_log = os.path.join(tmp, "ref"), os.path.join(tmp, "ref.jsonl")

        def timed_run(*more):
            t0 = time.time()
            r = subprocess.run(flags + list(more), capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"FAIL kill loop: the uninterrupted run failed:\n{r.stderr}")
            return time.time() - t0

        # the time to start and do one step (stdout is buffered in a pipe, so a separate run measures it)
        startup = timed_run("--checkpoint-dir", os.path.join(tmp, "probe"), "--log", "", "--steps", "1")
        start = time.time()
        timed_run("--checkpoint-dir", ref_ck, "--log", ref_log)
        ref_seconds = time.time() - start
        # Each kill comes after 0 to max_delay: the start, plus the time of half the steps still to go shared out
        # over the kills still to come (a kill never lets a run finish, and on average the kills end before the
        # last third of the steps); the time to start (the least a run left beside its logged steps' times) and
        # the time a step takes with its save are re-measured on the killed runs themselves, so that a machine that
        # speeds up or slows down (other work on it) still spreads the kills over the run; and once checkpoints
        # advance, a step never counts for more than the wall time the killed runs have taken per step gained so
        # far (starts and lost work included): an estimate from a busier moment of the machine (the uninterrupted
        # run's, or a kill mid-step) then cannot stretch the delays until the run ends before its last kills.
        per_step = (ref_seconds - startup) / a.steps
        elapsed, newest = 0.0, 0

        def next_delay(kills_left, steps_left):
            pace = min(per_step, elapsed / newest) if newest > 0 else per_step
            return a.max_delay or startup + pace * steps_left / (2 * max(kills_left, 1))

        max_delay = longest_delay = next_delay(a.kills, a.steps)

        ck, log = os.path.join(tmp, "ck"), os.path.join(tmp, "killed.jsonl")
        run = flags + ["--checkpoint-dir", ck, "--log", log, "--resume"]
        kills = lost = failed = finished_early = restarts = mid_save = 0
        newest = last_kill_step = 0
        while True:
            restarts += 1
            began, seen = time.time(), len(list(log_records(log))) if os.path.exists(log) else 0
            proc = subprocess.Popen(run, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if kills < a.kills:
                try:
                    proc.wait(timeout=rng.uniform(0.0, max_delay))
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    kills += 1
                    mid_save += bool(glob.glob(os.path.join(ck, "step_*.tmp*")))  # a staging dir left behind
            else:
                proc.wait()
            if proc.returncode not in (0, -signal.SIGKILL):
                failed += 1
                print(f"FAIL a restart exited {proc.returncode}:\n{proc.stderr.read()}")
            now = newest_complete(ck)
            if now < newest:
                lost += 1
                print(f"FAIL the newest complete checkpoint went from step {newest} to {now}")
            newest = max(newest, now)
            ran = time.time() - began
            elapsed += ran
            step_ms = [r["ms"] for r in list(log_records(log))[seen:] if "ms" in r] if os.path.exists(log) else []
            if step_ms:  # this run's own pace: its start (at most the time its steps leave), then its steps
                startup = min(startup, max(0.0, ran - sum(step_ms) / 1e3))
                per_step = 0.5 * per_step + 0.5 * max(ran - startup, 0.0) / len(step_ms)
            max_delay = next_delay(a.kills - kills, a.steps - newest)
            longest_delay = max(longest_delay, max_delay)
            if kills == a.kills and not last_kill_step:
                last_kill_step = newest
            if proc.returncode == 0:
                if kills < a.kills:
                    finished_early += 1
                break
            if failed > 3:
                break

        ref = logged_steps(ref_log)
        got = logged_steps(log)
        wrong = sum(1 for s, runs in got.items() for x in runs if ref.get(s, [None])[0] != x)
        repeated = sum(len(runs) - 1 for runs in got.values())
        final = os.path.join(ck, f"step_{a.steps:08d}")
        ref_final = os.path.join(ref_ck, f"step_{a.steps:08d}")
        want = checkpoint_files(ref_final)
        have = checkpoint_files(final) if os.path.isdir(final) else {}
        files = sorted(want)
        same = sorted(have) == files and all(have[f][0] == want[f][0] for f in files)
        ids, ref_ids = run_ids(log), run_ids(ref_log)
        final_ids = {have[f][1] for f in files if f.startswith("train_state") or f == "COMPLETE"} if same else set()
        one_run = len(set(ids)) == 1 and final_ids == set(ids) and ids[0] not in ref_ids
        if not one_run:
            print(f"FAIL the starts logged run ids {sorted(set(ids))}, the final checkpoint {sorted(final_ids)}, the "
                  f"uninterrupted run {ref_ids}: one id, the final checkpoint's, another run's than that")
        ok = (kills == a.kills and lost == 0 and failed == 0 and wrong == 0 and same and one_run and
              sorted(got) == sorted(ref))
        print(f"{'PASS' if ok else 'FAIL'} kill loop ({os.path.basename(a.bin)}, {a.steps} steps, --save-every 1 "
              f"--keep {a.keep}): {kills} kills ({mid_save} during a save, the last at step {last_kill_step}), {restarts} starts, {lost} lost checkpoints, {failed} failed "
              f"resumes, {len(got)} of {len(ref)} steps logged ({repeated} again after a kill), {wrong} with a loss "
              f"or norm unlike the uninterrupted run's, final checkpoint {'byte-identical' if same else 'DIFFERS'} "
              f"but for its run id, kept by every start since the last fresh one ({len(ids)}) "
              f"({', '.join(files)}); kills after 0 to {longest_delay * 1e3:.0f} ms; {time.time() - start:.0f} s (the "
              f"uninterrupted run {ref_seconds:.1f} s, {startup:.2f} s to its first step)")
        if finished_early:
            print(f"FAIL the run finished after {kills} of {a.kills} kills: raise --steps")
        sys.exit(0 if ok else 1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
