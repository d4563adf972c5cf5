"""The loss comparisons of scripts/multi_gpu_check.sh: the runs' logs (OUT/NAME.jsonl) against a 1-GPU run's, and
runs that must give bit-identical losses. Each prints PASS or FAIL lines and appends its records to the results."""
import json


def losses(out, name):
    """The losses a run logged, or [] when it left no log."""
    try:
        return [r["loss"] for r in map(json.loads, open(f"{out}/{name}.jsonl")) if "loss" in r]
    except OSError:
        return []


def against_one_gpu(out, results, check, gpus, runs, tol, steps=20):
    """runs: {name: the 1-GPU run it must match}; each must log `steps` losses within tol of it. Returns the failures."""
    bad = 0
    for name, ref_name in runs.items():
        ref, got = losses(out, ref_name), losses(out, name)
        ok = len(got) == len(ref) == steps
        diff = max(abs(a - b) for a, b in zip(got, ref)) if ok else float("nan")
        ok = ok and diff <= tol
        bad += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}: {len(got)} steps, max |loss - 1-GPU loss| = {diff:.2e} "
              f"(tol {tol:g}); first {got[:1]}, last {got[-1:]} vs {ref[-1:]}")
        with open(results, "a") as f:
            f.write(json.dumps({"check": check, "run": name, "gpus": gpus, "steps": len(got),
                                "max_abs_loss_diff": diff, "tol": tol, "ok": ok, "losses": got,
                                "ref_losses": ref}) + "\n")
    return bad


def identical(out, results, groups, check=None):
    """groups: (names, what): every run of names must have logged the same losses, some. Returns the failures."""
    bad = 0
    for names, what in groups:
        first = losses(out, names[0])
        ok = bool(first) and all(losses(out, n) == first for n in names[1:])
        bad += not ok
        print(f"{'PASS' if ok else 'FAIL'} bit-identical losses: {what} ({', '.join(names)})")
        if check:
            with open(results, "a") as f:
                f.write(json.dumps({"check": check, "runs": list(names), "what": what, "ok": ok}) + "\n")
    return bad
