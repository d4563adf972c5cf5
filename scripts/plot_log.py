#!/usr/bin/env python3
"""Plot training logs (the JSON lines of --log, train_llama or train_llama_ref) into one PNG:
train loss (raw and smoothed) with val loss, learning rate, gradient norm, tokens/s, MFU and peak memory
against step, every log overlaid in its own colour and named in the legend.

  python3 scripts/plot_log.py log/train_llama.jsonl
  python3 scripts/plot_log.py bf16.jsonl fp8.jsonl --names bf16 fp8 --out docs/img/fp8.png

A run's name is, unless --names says it, the log's file name and the commit of the binary that wrote it (from
the log's first line, which also holds the command line and the model). A log that --resume appended to holds
every part of the run; where a step appears twice (a resume from an older checkpoint), the later record wins.
A last line cut short by a kill is skipped. Panels a log has no numbers for (MFU and memory from the CPU
reference) are left empty. Needs matplotlib (scripts/setup.sh installs it into .venv).
"""
import argparse
import json
import math
import os
import sys


def fail(msg):
    print("error: " + msg, file=sys.stderr)
    sys.exit(1)


def read_log(path):
    """The run's first record, its steps and its val losses, each by step (the last record of a step wins)."""
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        fail("cannot read the log '%s': %s" % (path, e.strerror))
    run, steps, val, bad = None, {}, {}, 0
    with f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            if i >= len(lines) - 2:  # the last line of a killed run
                continue
            bad += 1
            continue
        if not isinstance(rec, dict):
            bad += 1
        elif "run" in rec and run is None:
            run = rec["run"]
        elif "loss" in rec and "step" in rec:
            steps[rec["step"]] = rec
        elif "val_loss" in rec and "step" in rec:
            val[rec["step"]] = rec["val_loss"]
    if bad:
        print("warning: %s: %d lines are not JSON records; skipped" % (path, bad), file=sys.stderr)
    if not steps:
        fail("'%s' holds no training steps (is it a --log of train_llama or train_llama_ref?)" % path)
    return run or {}, steps, val


def smooth(values, window):
    """Mean of the last `window` finite values at each point (NaN where none)."""
    out, acc = [], []
    for v in values:
        if v is not None and math.isfinite(v):
            acc.append(v)
        acc = acc[-window:]
        out.append(sum(acc) / len(acc) if acc else float("nan"))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("logs", nargs="+", help="JSON lines logs (--log)")
    p.add_argument("--names", nargs="+", help="one name per log, for the legend")
    p.add_argument("--out", help="the PNG to write (default: the first log's path with .png)")
    p.add_argument("--smooth", type=int, default=0,
                   help="steps in the moving mean of the train loss (default: a 50th of the longest run, at least 1)")
    p.add_argument("--title", help="the figure's title (default: the runs' models)")
    args = p.parse_args()
    if args.names and len(args.names) != len(args.logs):
        fail("--names gives %d names for %d logs" % (len(args.names), len(args.logs)))
    if args.smooth < 0:
        fail("--smooth takes a number of steps >= 1")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is not installed (scripts/setup.sh puts it into .venv: .venv/bin/python3 scripts/plot_log.py)")

    runs = []
    for i, path in enumerate(args.logs):
        run, steps, val = read_log(path)
        name = args.names[i] if args.names else "%s (%s)" % (os.path.basename(path), run.get("commit", "?"))
        runs.append((name, run, steps, val))
    longest = max(len(r[2]) for r in runs)
    window = args.smooth or max(1, longest // 50)

    panels = [("loss", "train loss (smoothed, raw faint) and val loss", False),
              ("lr", "learning rate", False), ("grad_norm", "gradient norm", True),
              ("tokens_per_s", "tokens/s (all GPUs)", False), ("mfu", "MFU (bf16 FLOPs, %)", False),
              ("peak_mem_gib", "peak memory (GiB)", False)]
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    for ax, (key, title, log_y) in zip(axes.flat, panels):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        drawn = False
        for k, (name, run, steps, val) in enumerate(runs):
            color = "C%d" % (k % 10)
            xs = sorted(steps)
            ys = [steps[s].get(key) for s in xs]
            if key == "mfu":
                ys = [None if y is None else 100.0 * y for y in ys]
            if all(y is None for y in ys):
                continue
            drawn = True
            if key == "loss":
                ax.plot(xs, ys, color=color, alpha=0.25, linewidth=0.8)
                ax.plot(xs, smooth(ys, window), color=color, linewidth=1.6, label=name)
                if val:
                    vx = sorted(val)
                    ax.plot(vx, [val[s] for s in vx], "o--", color=color, markersize=4, linewidth=1,
                            label="%s, val" % name)
            else:
                ax.plot(xs, [float("nan") if y is None else y for y in ys], color=color, linewidth=1.2, label=name)
        if log_y and drawn:
            ax.set_yscale("log")
        if not drawn:
            ax.text(0.5, 0.5, "not in these logs", ha="center", va="center", transform=ax.transAxes, color="gray")
    axes.flat[0].legend(fontsize=8)
    models = sorted({"%s: d_model %s, %s layers" % (os.path.basename(r[1].get("program", "?")),
                                                    r[1].get("model", {}).get("d_model", "?"),
                                                    r[1].get("model", {}).get("n_layer", "?")) for r in runs})
    fig.suptitle(args.title or "; ".join(models), fontsize=11)
    fig.tight_layout()
    out = args.out or os.path.splitext(args.logs[0])[0] + ".png"
    try:
        fig.savefig(out, dpi=110)
    except OSError as e:
        fail("cannot write '%s': %s" % (out, e.strerror))
    print("wrote %s (%d run%s, loss smoothed over %d steps)" % (out, len(runs), "" if len(runs) == 1 else "s", window))


if __name__ == "__main__":
    main()
