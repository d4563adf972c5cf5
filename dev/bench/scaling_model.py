#!/usr/bin/env python3
"""A model of train_llama's data-parallel step time from NCCL measurements.

Reads JSON lines (several files may be given; other lines are skipped):
  {"bench": "nccl", ...}        dev/bench/nccl_bench records: one collective, group and size each
  {"check": "netscale" | "scaling8b4" | "scaling", ...}   trainer records of scripts/multi_gpu_check.sh
                                with params, stage, mode, hosts, gpus_per_host, micro_steps, B, T,
                                tokens_per_s_per_gpu and one_gpu.ms (the compute-only step time)
Fits t = alpha + beta * bytes * (n - 1) / n per (collective, link kind), predicts the measured
trainer points from the fits and the one-GPU step time, and predicts 1..64 hosts x 8 GPUs for
the 1B and the 8B model on a 400 Gb/s-per-GPU network.

  python3 dev/bench/scaling_model.py RESULTS.jsonl [MORE.jsonl ...] [--json OUT.jsonl]
          [--markdown OUT.md] [--plot OUT.png]

Step time = one-GPU compute time + the communication that compute does not hide:
  gradient reduce-scatter (all-reduce at stage 0): hidden behind the last micro-step's backward
    (2/3 of a micro-step) except the last bucket (--tail-fraction of it), which nothing follows;
  weight all-gather after the update (stages 1, 2): hidden behind the first forward (1/3);
  stage 3's per-micro-step gathers (forward + backward): each micro-step takes the longer of its
    compute and its gathers; flat, the last micro-step's gradient sums share the gathers' link, so
    that micro-step takes the longer of its compute and gathers + sums, and only the last bucket's
    share of the sums (--tail-fraction) comes after it.
Hierarchical (--shard-over host) collectives are the sum of their in-host and across-host parts.
NCCL's sockets at a setting other than its defaults (records' "sockets", e.g. "4x2": the trainer sets 4 threads x 2
connections where hosts are joined by TCP) are a link kind of their own ("net@4x2"), fitted from nccl_bench points
at that setting; a stand-in's sockets also differ between leases (2.3-9 GB/s), so pass one lease's records.
Compressed communication (issue 29: weights all-gathered as FP8 or int8 codes with a scale per
block, gradients reduced quantized; issue 28: the updated weights gathered as their changes,
--update-gather delta, across the hosts where sharded over them): --weight-bytes, --grad-bytes and
--update-bytes give the bytes per parameter on the wire (bf16: 2; codes of one byte with an fp32
scale per 128: 1.03125; the changes: 1.08 at the default lr) and the predictions are made with and
without them, the gain beside each; a trainer record may carry its own weight_bytes_per_param /
grad_bytes_per_param / update_bytes_per_param. A quantized reduction (ZeRO++'s all-to-all with
fp32 sums, gradient bytes other than 2) takes nccl_bench's all_to_all points where there are some
for its link (NCCL's grouped sends and receives, which need not move bytes as fast as its rings),
else it is modelled as a reduce-scatter of the compressed bytes; the quantisation kernels' time is
not modelled.
"""
import argparse
import json
import statistics
import sys

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "reduce_scatter_fp32", "all_to_all")
CHECKS = ("netscale", "scaling8b4", "scaling", "fp8gather", "quantized_one_micro_step", "qmatrix")
POINT_FIELDS = ("stage", "mode", "hosts", "gpus_per_host", "micro_steps", "B", "T", "tokens_per_s_per_gpu")
# the two predicted models: parameters, sequences per micro-step, sequence length and the
# fallback one-GPU time per micro-step (H100) when no one_gpu record gives it
# (layers and each decoder layer's parameters: stage 3 gathers layer by layer, see step_time)
MODELS = {
    "1b": {"name": "llama3.2-1b", "params": 1235814400, "B": 8, "T": 2048, "t_micro": 0.231, "layers": 16,
           "layer_params": 60821504},
    "8b": {"name": "llama3.1-8b", "params": 8030261248, "B": 1, "T": 8192, "t_micro": 0.62, "layers": 32,
           "layer_params": 218112000},
}


def model_shape(name):
    """(layers, parameters per layer) of a model by name, or None."""
    m = next((m for m in MODELS.values() if m["name"] == name), None)
    return (m["layers"], m["layer_params"]) if m else None
HOSTS = (1, 2, 4, 8, 16, 32, 64)
GPUS_PER_HOST = 8
MODES = [(s, m) for s in (1, 2, 3) for m in ("flat", "host")]


def die(msg):
    sys.exit(f"scaling_model.py: {msg}")


def read_records(paths):
    """All JSON objects of the files, in order; lines that are not JSON objects are skipped."""
    recs = []
    for path in paths:
        try:
            with open(path) as f:
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        r = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(r, dict):
                        recs.append(r)
        except OSError as e:
            die(f"cannot read {path}: {e}")
    return recs


def nccl_link(r):
    """Link kind of one nccl_bench point: nvlink within a host, net across hosts, and
    net_mixed for a flat ring over several hosts with several GPUs each (the net links
    govern it, but its in-host hops make it a different ring, so it gets its own fit)."""
    if r["group"] == "host" or (r["group"] == "all" and r["hosts"] == 1):
        return "nvlink"
    if r["group"] == "across":
        return "net"
    if r["group"] == "all":
        return "net_mixed" if r["world"] > r["hosts"] else "net"
    return None


def sockets_of(r):
    """NCCL's socket threads x connections per channel a record ran with, as "4x2"; None at NCCL's own defaults
    (1 x 1: records that say nothing, or say 1x1). Records say "sockets" (nccl_bench, and the trainer's, which sets
    4 x 2 itself where hosts are joined by TCP: llmc/parallel/nccl_sockets.h), or socket_threads and
    socks_per_thread (the runs that set them by hand before it did)."""
    s = r.get("sockets")
    if s is None and "socket_threads" in r:
        s = f"{r['socket_threads']}x{r.get('socks_per_thread', 1)}"
    return None if s in (None, "", "1x1") else str(s)


def with_sockets(link, sockets):
    """The link kind of a transfer over NCCL's sockets at a setting other than its defaults gets its own fit:
    "net" at 4 x 2 is "net@4x2" (NVLink does not use sockets)."""
    return f"{link}@{sockets}" if sockets and link and link.startswith("net") else link


def base_link(link):
    """A link kind without its socket setting: "net_mixed@4x2" is "net_mixed"."""
    return link.split("@")[0]


def nccl_points(recs):
    pts = []
    for r in recs:
        if r.get("bench") != "nccl":
            continue
        try:
            p = {"collective": r["collective"], "group": r["group"], "ranks": int(r["ranks"]),
                 "world": int(r["world"]), "hosts": int(r["hosts"]), "bytes": float(r["bytes"]),
                 "seconds": float(r["seconds"]), "label": r.get("label", "")}
        except (KeyError, TypeError, ValueError):
            continue
        if p["collective"] not in COLLECTIVES or p["ranks"] < 2 or p["seconds"] <= 0 or p["bytes"] <= 0:
            continue
        p["link"] = with_sockets(nccl_link(p), sockets_of(r))
        if p["link"]:
            pts.append(p)
    return pts


def fit_line(xs, ts):
    """Weighted least squares of t = alpha + beta * x with weights 1/t^2 (relative error, so
    the microsecond points count as much as the second-long ones). Solves the 2x2 normal
    equations by hand; a negative alpha (noise at small sizes) is clamped to 0 and beta refitted
    through the origin, as is a set of points with a single x."""
    ws = [1.0 / (t * t) for t in ts]
    sw = sum(ws)
    swx = sum(w * x for w, x in zip(ws, xs))
    swxx = sum(w * x * x for w, x in zip(ws, xs))
    swt = sum(w * t for w, t in zip(ws, ts))
    swxt = sum(w * x * t for w, x, t in zip(ws, xs, ts))
    det = sw * swxx - swx * swx
    alpha = beta = None
    if det > 1e-12 * sw * swxx:
        alpha = (swxx * swt - swx * swxt) / det
        beta = (sw * swxt - swx * swt) / det
    if alpha is None or alpha < 0 or beta <= 0:
        alpha, beta = 0.0, swxt / swxx
    return alpha, beta


def fit_all(pts):
    """{(collective, link): fit} over all sizes and rank counts of that pair."""
    groups = {}
    for p in pts:
        groups.setdefault((p["collective"], p["link"]), []).append(p)
    fits = {}
    for key, ps in sorted(groups.items()):
        xs = [p["bytes"] * (p["ranks"] - 1) / p["ranks"] for p in ps]
        ts = [p["seconds"] for p in ps]
        alpha, beta = fit_line(xs, ts)
        err = max(abs(alpha + beta * x - t) / t for x, t in zip(xs, ts))
        fits[key] = {"collective": key[0], "link": key[1], "alpha": alpha, "beta": beta,
                     "points": len(ps), "ranks": sorted({p["ranks"] for p in ps}),
                     "max_rel_err": err, "source": "fit"}
    return fits


def coll_time(params, nbytes, n):
    """Ring model of one collective over n ranks; nothing to do for a group of one."""
    if n <= 1:
        return 0.0
    return params["alpha"] + params["beta"] * nbytes * (n - 1) / n


def step_time(stage, mode, hosts, gpn, micro, t_micro, nparams, links, lookup, tail, shape=None, wbytes=2.0,
              gbytes=2.0, ubytes=2.0):
    """Modelled step time (s) and its parts. links maps the groups "flat" (all ranks),
    "host" (the G GPUs of a host) and "across" (one GPU per host) to a link kind;
    lookup(collective, link) gives {"alpha", "beta"}; it is called only for groups of 2 or more,
    so a configuration never asks for a link it does not use. wbytes, gbytes: bytes per parameter
    of stage 3's per-layer weight gathers and of the gradients' reductions (bf16: 2); ubytes: of the gather of
    the updated weights after AdamW, flat or across the hosts (--update-gather delta; bf16: 2), whose gather
    inside a host stays bf16."""
    n = hosts * gpn
    rs = "reduce_scatter" if gbytes == 2.0 else "quantized_sum"  # what lookup() resolves (all_to_all_or_rs)
    w = wbytes * nparams  # bytes of all weights on the wire in stage 3's per-layer gathers
    exact_w = 2.0 * nparams  # the updated weights in bf16: the gather inside a host
    update_w = ubytes * nparams  # and as they cross the flat ring or the hosts: bf16 or their changes
    g = gbytes * nparams  # and of all gradients

    def t(coll, group, nranks, nbytes):
        return coll_time(lookup(coll, links[group]), nbytes, nranks) if nranks > 1 else 0.0

    # the last bucket (embedding) is reduced after the backward has nothing left to overlap:
    # f*t_rs + max(0, (1-f)*t_rs - 2/3 t_micro) = max(f*t_rs, t_rs - 2/3 t_micro)
    def grad_exposed(t_rs):
        return max(tail * t_rs, t_rs - 2.0 / 3.0 * t_micro)

    def gather_exposed(t_ag):  # hidden behind the next step's first forward
        return max(0.0, t_ag - t_micro / 3.0)

    # Stage 3 gathers a micro-step's weights layer by layer into staging slots (llmc/parallel/zero.h): the
    # embedding's and the head's slots keep theirs for the whole step, and the two layer slots
    # still hold the last two layers of one pass when the next begins, so a micro-step gathers
    # 2 (L - 2) layers, each its own collective. Without the model's shape: all weights twice.
    def stage3_gathers(group, nranks):
        if not shape:
            return 2 * t("all_gather", group, nranks, w)
        layers, per_layer = shape
        return 2 * (layers - 2) * t("all_gather", group, nranks, wbytes * per_layer)

    parts = {"t_compute": micro * t_micro, "t_grad": 0.0, "t_gather_after": 0.0, "t_gather_micro": 0.0}
    if stage == 0:  # a flat all-reduce whatever the mode
        parts["t_grad"] = t("all_reduce", "flat", n, g)
        exposed = grad_exposed(parts["t_grad"])
    elif mode == "flat":
        parts["t_grad"] = t(rs, "flat", n, g)
        exposed = grad_exposed(parts["t_grad"])
        if stage == 3:
            parts["t_gather_micro"] = stage3_gathers("flat", n)
            # one link: the last micro-step's sums queue behind its gathers (measured at one micro-step on the
            # stand-in: a step of 1.41 s where compute, gathers and sums side by side give 0.96)
            tg, last = parts["t_gather_micro"], max(t_micro, parts["t_gather_micro"] + parts["t_grad"])
            parts["t_step"] = (micro - 1) * max(t_micro, tg) + last + tail * parts["t_grad"]
            parts["t_exposed"] = parts["t_step"] - parts["t_compute"]
            return parts
        else:
            parts["t_gather_after"] = t("all_gather", "flat", n, update_w)
            exposed += gather_exposed(parts["t_gather_after"])
    else:  # hierarchical: in-host over G ranks, then across hosts over H ranks with 1/G of the bytes
        parts["t_grad"] = t(rs, "host", gpn, g) + t(rs, "across", hosts, g / gpn)
        exposed = grad_exposed(parts["t_grad"])
        parts["t_gather_after"] = t("all_gather", "across", hosts, update_w / gpn)
        if stage == 3:
            parts["t_gather_micro"] = stage3_gathers("host", gpn)
        else:
            parts["t_gather_after"] += t("all_gather", "host", gpn, exact_w)
        exposed += gather_exposed(parts["t_gather_after"])
    # stage 3: every micro-step is bound by the slower of its compute and its two gathers
    compute = micro * max(t_micro, parts["t_gather_micro"])
    parts["t_exposed"] = compute - parts["t_compute"] + exposed
    parts["t_step"] = compute + exposed
    return parts


CODE_BYTES = 1.0 + 4.0 / 128  # a one-byte code per value and an fp32 scale per 128 (llmc/kernels/block_codec.h)
# --update-gather delta: a one-byte change per weight and 8 bytes per escape (llmc/kernels/delta_codec.h); 0.98%
# escapes at lr 3e-4 and weights of std 0.02 (dev/bench/delta_gather_estimate.py), the netscale runs' setting
DELTA_BYTES = 1.08


def wire_bytes(r, flag_field, bytes_field):
    """Bytes per parameter a trainer record put on the wire for its weights' gathers or its gradients'
    reductions: its own bytes field, else from its --weight-gather / --grad-reduce (int8, e4m3: codes), else bf16."""
    if bytes_field in r:
        return float(r[bytes_field])
    if r.get(flag_field) in ("int8", "e4m3"):
        return CODE_BYTES
    if flag_field == "update_gather" and r.get(flag_field) == "delta":
        return DELTA_BYTES
    # --fp8 at stage 3 gathers its layers as their E4M3 codes, one byte a weight (llmc/parallel/zero_fp8.h): records
    # say fp8_codes, or auto where the trainer chose them (records of the time before them say nothing)
    fp8_codes = r.get(flag_field) == "fp8_codes" or (r.get(flag_field) == "auto" and r.get("precision") == "fp8"
                                                     and r.get("stage") == 3)
    return 1.0 if flag_field == "weight_gather" and fp8_codes else 2.0


def trainer_points(recs):
    """The trainer records with every field the model needs, and how many records of those
    checks lacked some (e.g. the older 'scaling' records without stage, hosts, micro_steps)."""
    pts, skipped = [], 0
    # a record without one_gpu takes the one-GPU run of the same model and shape among the records, of the same
    # lease where the records carry its date or lease (compute speed differs between machines by a few %), the
    # same precision (an --fp8 run computes faster), and the same micro-steps where there is one (at one
    # micro-step each step also pays the optimizer)
    def single_key(r):
        return (r.get("model"), r.get("B"), r.get("T"), r.get("date"), r.get("lease"), r.get("precision", "bf16"))

    singles = {}
    for r in recs:
        if r.get("check") in CHECKS and r.get("hosts") == 1 and r.get("gpus_per_host") == 1 and "ms" in r:
            one = {"ms": r["ms"], "micro_steps": r.get("micro_steps")}
            singles[single_key(r)] = one
            singles[single_key(r) + (r.get("micro_steps"),)] = one
    for r in recs:
        if r.get("check") not in CHECKS or (r.get("hosts") == 1 and r.get("gpus_per_host") == 1):
            continue
        one = (r.get("one_gpu") or singles.get(single_key(r) + (r.get("micro_steps"),)) or
               singles.get(single_key(r)))
        nparams = r.get("params") or next((m["params"] for m in MODELS.values() if m["name"] == r.get("model")), None)
        if (any(k not in r for k in POINT_FIELDS) or r["mode"] not in ("flat", "host") or not nparams
                or not isinstance(one, dict) or not one.get("ms")):
            skipped += 1
            continue
        # the one-GPU run may have used another number of micro-steps: per micro-step time
        one_micro = one.get("micro_steps", r["micro_steps"])
        pts.append({"check": r["check"], "run": r.get("run", "?"), "model": r.get("model", "?"),
                    "params": int(nparams), "stage": int(r["stage"]), "mode": r["mode"],
                    "hosts": int(r["hosts"]), "gpus_per_host": int(r["gpus_per_host"]),
                    "micro_steps": int(r["micro_steps"]), "B": int(r["B"]), "T": int(r["T"]),
                    "link": r.get("link"), "sockets": sockets_of(r), "measured": float(r["tokens_per_s_per_gpu"]),
                    "wbytes": wire_bytes(r, "weight_gather", "weight_bytes_per_param"),
                    "gbytes": wire_bytes(r, "grad_reduce", "grad_bytes_per_param"),
                    "ubytes": wire_bytes(r, "update_gather", "update_bytes_per_param"),
                    "t_micro": float(one["ms"]) / 1000.0 / float(one_micro)})
    return pts, skipped


def point_links(p):
    """Link kinds of a trainer point's groups. Its optional "link" names the transport that
    joined its hosts (or, for a one-host run, of the whole run, e.g. P2P and SHM off)."""
    h, g, link = p["hosts"], p["gpus_per_host"], p["link"]
    links = {"host": "nvlink", "across": link or "net"}
    if h == 1:
        links["flat"] = link or "nvlink"
        if link:
            links["host"] = link
    elif (link or "net") == "net":
        links["flat"] = "net_mixed" if g > 1 else "net"
    else:
        links["flat"] = link
    return {group: with_sockets(kind, p.get("sockets")) for group, kind in links.items()}


def all_to_all_or_rs(coll, link, fits, notes):
    """The collective a quantized sum ("quantized_sum", step_time) is timed as over link: all_to_all where
    nccl_bench measured it there, else reduce_scatter (said in notes); any other collective as it is."""
    if coll != "quantized_sum":
        return coll
    if ("all_to_all", link) in fits:
        return "all_to_all"
    notes.add(f"quantized sums over {link}: no all_to_all points, timed as a reduce-scatter of the codes")
    return "reduce_scatter"


def make_measured_lookup(fits, nvlink_default, notes, ctx):
    """Fitted parameters for the measured points; ctx["run"] names the point asking (for errors)."""
    def lookup(coll, link):
        net = link.replace("net_mixed", "net")  # a mixed ring's quantized sums and missing fits: the net's
        coll = all_to_all_or_rs(coll, net, fits, notes)
        if (coll, link) in fits:
            return fits[(coll, link)]
        if base_link(link) == "net_mixed" and (coll, net) in fits:
            notes.add(f"{coll} over {link}: no points, the {net} fit stands in")
            return fits[(coll, net)]
        if link == "nvlink":
            notes.add(f"{coll} over nvlink: no points, the default nvlink parameters stand in")
            return nvlink_default
        die(f"no NCCL points for {coll} over {link}, which the trainer point {ctx['run']} needs; "
            f"run dev/bench/nccl_bench on that link and pass its records")
    return lookup


def default_t_micro(pts, key, given):
    """Per micro-step compute time for a predicted model: the option, else the median of the
    measured one-GPU records of that model and T (scaled to the model's B), else the constant."""
    m = MODELS[key]
    if given is not None:
        return given, "--t-micro-" + key
    ts = [p["t_micro"] * m["B"] / p["B"] for p in pts if p["model"] == m["name"] and p["T"] == m["T"]]
    if ts:
        return statistics.median(ts), f"median of {len(ts)} one_gpu records"
    return m["t_micro"], "built-in default"


BF16_WIRE = (2.0, 2.0, 2.0)  # bytes per parameter of the weights' gathers, the gradients' sums, the update's gather


def wire_of(args):
    """The bytes per parameter the options put on the wire, as BF16_WIRE orders them."""
    return (args.weight_bytes, args.grad_bytes, args.update_bytes)


def predict(args, fits, pts):
    net = {"alpha": args.net_latency_us * 1e-6, "beta": 1.0 / (args.nic_gbit / 8.0 * 1e9 * args.net_efficiency)}
    nv_default = {"alpha": args.nvlink_latency_us * 1e-6, "beta": 1.0 / (args.nvlink_gbs * 1e9)}
    nv_src = {}

    def lookup(coll, link):
        if link in ("net", "net_mixed"):  # a ring over all N*8 GPUs is bound by each GPU's own NIC
            return net
        coll = all_to_all_or_rs(coll, "nvlink", fits, set())
        if args.nvlink_given or (coll, "nvlink") not in fits:
            nv_src[coll] = "options"
            return nv_default
        nv_src[coll] = "fit"
        return fits[(coll, "nvlink")]

    preds, notes = [], []
    for key, m in MODELS.items():
        t_micro, src = default_t_micro(pts, key, getattr(args, "t_micro_" + key))
        batch = getattr(args, "batch_" + key)
        notes.append(f"{m['name']}: {t_micro * 1000:.1f} ms per micro-step of B={m['B']}, T={m['T']} ({src}), "
                     f"global batch {batch} tokens")
        for hosts in HOSTS:
            per_micro = hosts * GPUS_PER_HOST * m["B"] * m["T"]  # tokens of one micro-step, all GPUs
            micro = batch // per_micro
            if micro < 1:
                notes.append(f"{m['name']} on {hosts}x{GPUS_PER_HOST}: the batch of {batch} tokens is less than "
                             f"one micro-step on every GPU; 1 micro-step used (a batch of {per_micro})")
                micro = 1
            elif batch % per_micro:
                notes.append(f"{m['name']} on {hosts}x{GPUS_PER_HOST}: {micro} micro-steps, a batch of "
                             f"{micro * per_micro} tokens")
            for stage, mode in MODES:
                links = {"flat": "net" if hosts > 1 else "nvlink", "host": "nvlink", "across": "net"}
                for wbytes, gbytes, ubytes in sorted({BF16_WIRE, wire_of(args)}, reverse=True):
                    parts = step_time(stage, mode, hosts, GPUS_PER_HOST, micro, t_micro, m["params"], links,
                                      lookup, args.tail_fraction, (m["layers"], m["layer_params"]), wbytes, gbytes,
                                      ubytes)
                    tps = m["B"] * m["T"] * micro / parts["t_step"]
                    preds.append({"kind": "prediction", "model": m["name"], "hosts": hosts,
                                  "gpus_per_host": GPUS_PER_HOST, "stage": stage, "mode": mode,
                                  "micro_steps": micro, "weight_bytes_per_param": wbytes,
                                  "grad_bytes_per_param": gbytes, "update_bytes_per_param": ubytes,
                                  "tokens_per_s_per_gpu": tps,
                                  "fraction_of_one_gpu": parts["t_compute"] / parts["t_step"], **parts})
    for coll, s in sorted(nv_src.items()):
        notes.append(f"nvlink {coll}: " + ("fitted parameters" if s == "fit" else
                     f"{args.nvlink_gbs:g} GB/s, {args.nvlink_latency_us:g} us (options/defaults)"))
    return preds, notes


def wire_words(args):
    return (f"weights {args.weight_bytes:g}, gradients {args.grad_bytes:g} and the updated weights "
            f"{args.update_bytes:g} bytes per parameter on the wire")


def text_table(headers, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))
    return [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]


def md_table(headers, rows):
    return (["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
            + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


PLOT_NAMED_POINTS = 8  # measured points per panel up to which the plot names each


def plot(path, preds, points):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not importable: no plot written to {path}", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, len(MODELS), figsize=(6 * len(MODELS), 4.5))
    for ax, m in zip(axes, MODELS.values()):
        for stage, mode in MODES:
            ps = [p for p in preds if p["model"] == m["name"] and p["stage"] == stage and p["mode"] == mode]
            # stages 1 and 2 move the same bytes: markers of decreasing size keep both visible
            ax.plot([p["hosts"] for p in ps], [p["tokens_per_s_per_gpu"] for p in ps], marker="os^"[stage - 1],
                    markersize=10 - 3 * stage, fillstyle="none", linestyle="-" if mode == "host" else "--",
                    label=f"ZeRO {stage} {mode}")
        meas = [p for p in points if p["model"] == m["name"]]
        if meas:
            # names only where they stay legible: beyond a few points at one host count they overlap (the
            # tables and the JSON name every point)
            named = len(meas) <= PLOT_NAMED_POINTS
            ax.scatter([p["hosts"] for p in meas], [p["measured"] for p in meas], color="black", marker="x",
                       zorder=5, label="measured (own G, micro)" + ("" if named else "; names in the JSON"))
            for p in meas if named else []:
                ax.annotate(p["run"], (p["hosts"], p["measured"]), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"hosts (x{GPUS_PER_HOST} GPUs)")
        ax.set_ylabel("tokens/s per GPU")
        ax.set_title(m["name"])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="JSON-lines files with nccl_bench and/or trainer records")
    ap.add_argument("--json", metavar="OUT", help="write every fit, point and prediction as JSON lines to OUT")
    ap.add_argument("--markdown", metavar="OUT", help="write the measured-vs-model and prediction tables to OUT")
    ap.add_argument("--plot", metavar="OUT.png", help="plot the predictions and measured points (needs matplotlib)")
    ap.add_argument("--tail-fraction", type=float, default=0.15, metavar="F",
                    help="share of the gradient reduce-scatter (the last bucket's) that is never hidden (0.15)")
    ap.add_argument("--nic-gbit", type=float, default=400.0, metavar="GBIT", help="network per GPU, Gb/s, for predictions (400)")
    ap.add_argument("--net-efficiency", type=float, default=0.9, metavar="F",
                    help="bus bandwidth across hosts as a share of the NIC rate, for predictions (0.9)")
    ap.add_argument("--net-latency-us", type=float, default=20.0, metavar="US",
                    help="collective latency across hosts, us, for predictions (20)")
    ap.add_argument("--nvlink-gbs", type=float, default=None, metavar="GBS",
                    help="NVLink bus bandwidth, GB/s, for predictions; overrides the nvlink fits "
                         "(default: the fits, else 370)")
    ap.add_argument("--nvlink-latency-us", type=float, default=None, metavar="US",
                    help="NVLink collective latency, us: overrides the nvlink fits in predictions like "
                         "--nvlink-gbs; both stand in for a missing nvlink fit anywhere (15)")
    ap.add_argument("--t-micro-1b", type=float, default=None, metavar="S",
                    help="1B one-GPU time per micro-step (B=8, T=2048), s (default: measured one_gpu "
                         "records of llama3.2-1b, else 0.231)")
    ap.add_argument("--t-micro-8b", type=float, default=None, metavar="S",
                    help="8B one-GPU time per micro-step (B=1, T=8192), s (default: measured one_gpu "
                         "records of llama3.1-8b, e.g. scaling8b4, else 0.62)")
    ap.add_argument("--batch-1b", type=int, default=524288, metavar="TOKENS", help="1B global batch, tokens (524288)")
    ap.add_argument("--batch-8b", type=int, default=1048576, metavar="TOKENS", help="8B global batch, tokens (1048576)")
    ap.add_argument("--weight-bytes", type=float, default=2.0, metavar="B",
                    help="bytes per parameter of the weights' all-gathers, for a second prediction table with its "
                         "gain (2 = bf16, the default: none; 1.03125 = one-byte codes with an fp32 scale per 128)")
    ap.add_argument("--grad-bytes", type=float, default=2.0, metavar="B",
                    help="bytes per parameter of the gradients' reductions, likewise (2 = bf16)")
    ap.add_argument("--update-bytes", type=float, default=2.0, metavar="B",
                    help="bytes per parameter of the updated weights' gather after AdamW at stages 1 and 2, and "
                         "across the hosts with --shard-over host, likewise (2 = bf16; %g = --update-gather "
                         "delta at the default lr)" % DELTA_BYTES)
    args = ap.parse_args()
    args.nvlink_given = args.nvlink_gbs is not None or args.nvlink_latency_us is not None
    args.nvlink_gbs = 370.0 if args.nvlink_gbs is None else args.nvlink_gbs
    args.nvlink_latency_us = 15.0 if args.nvlink_latency_us is None else args.nvlink_latency_us
    if not 0 <= args.tail_fraction <= 1:
        die("--tail-fraction must lie in [0, 1]")
    if not all(0 < b <= 4 for b in wire_of(args)):
        die("--weight-bytes, --grad-bytes and --update-bytes must lie in (0, 4]")

    recs = read_records(args.results)
    fits = fit_all(nccl_points(recs))
    points, skipped = trainer_points(recs)
    out_json = []

    print("NCCL fits, t = alpha + bytes * (n-1)/n / busbw, weights 1/t^2")
    rows = []
    for f in fits.values():
        rows.append([f["collective"], f["link"], f["points"], ",".join(map(str, f["ranks"])),
                     f"{f['alpha'] * 1e6:.1f}", f"{1e-9 / f['beta']:.2f}", f"{100 * f['max_rel_err']:.1f}%"])
        out_json.append({"kind": "fit", **f, "latency_us": f["alpha"] * 1e6, "busbw_gbs": 1e-9 / f["beta"]})
    if rows:
        print("\n".join(text_table(["collective", "link", "points", "ranks", "latency us", "bus GB/s",
                                    "max err"], rows)))
    else:
        print("  (no nccl records)")

    # a) the measured trainer points
    nv_default = {"alpha": args.nvlink_latency_us * 1e-6, "beta": 1.0 / (args.nvlink_gbs * 1e9)}
    notes, ctx = set(), {"run": ""}
    lookup = make_measured_lookup(fits, nv_default, notes, ctx)
    heads = ["run", "model", "ZeRO", "mode", "hosts x G", "micro", "measured tok/s", "model tok/s", "error"]
    rows, misses, worst = [], [], 0.0
    for p in points:
        ctx["run"] = p["run"]
        parts = step_time(p["stage"], p["mode"], p["hosts"], p["gpus_per_host"], p["micro_steps"], p["t_micro"],
                          p["params"], point_links(p), lookup, args.tail_fraction, model_shape(p["model"]),
                          p["wbytes"], p["gbytes"], p["ubytes"])
        pred = p["B"] * p["T"] * p["micro_steps"] / parts["t_step"]
        err = (pred - p["measured"]) / p["measured"]
        worst = max(worst, abs(err))
        if abs(err) > 0.10:
            misses.append(f"{p['run']} ({100 * err:+.1f}%)")
        rows.append([p["run"], p["model"], p["stage"], p["mode"], f"{p['hosts']}x{p['gpus_per_host']}",
                     p["micro_steps"], f"{p['measured']:.0f}", f"{pred:.0f}", f"{100 * err:+.1f}%"])
        out_json.append({"kind": "point", **p, "predicted": pred, "rel_err": err, **parts})
    print(f"\nMeasured trainer points against the model ({len(points)}; {skipped} trainer records "
          f"without the needed fields skipped)")
    point_lines = text_table(heads, rows) if rows else ["  (no trainer records with the needed fields)"]
    print("\n".join(point_lines))
    if points:
        verdict = (f"max error {100 * worst:.1f}%: " +
                   ("all points within 10%" if not misses else "outside 10%: " + ", ".join(misses)))
        print(verdict)
    for n in sorted(notes):
        print("note:", n)

    # b) predictions for 1..64 hosts of 8 GPUs
    preds, pnotes = predict(args, fits, points)
    out_json += preds
    print(f"\nPredicted tokens/s per GPU (share of one GPU), {GPUS_PER_HOST} GPUs per host, network "
          f"{args.nic_gbit:g} Gb/s per GPU x {args.net_efficiency:g}, {args.net_latency_us:g} us")
    for n in pnotes:
        print("note:", n)
    compressed = wire_of(args) != BF16_WIRE
    pheads = ["model", "hosts", "micro"] + [f"Z{s} {m}" for s, m in MODES]

    def prediction_rows(wire, gain):
        rows = []
        for name in [m["name"] for m in MODELS.values()]:
            for hosts in HOSTS:
                def of(wire_bytes):
                    return {(p["stage"], p["mode"]): p for p in preds if p["model"] == name and p["hosts"] == hosts
                            and wire_key(p) == wire_bytes}
                ps, base = of(wire), of(BF16_WIRE)
                rows.append([name, hosts, ps[MODES[0]]["micro_steps"]] + [
                    f"{ps[k]['tokens_per_s_per_gpu']:.0f} (" + (
                        f"{ps[k]['tokens_per_s_per_gpu'] / base[k]['tokens_per_s_per_gpu']:.2f}x" if gain else
                        f"{100 * ps[k]['fraction_of_one_gpu']:.0f}%") + ")" for k in MODES])
        return rows

    def wire_key(p):
        return (p["weight_bytes_per_param"], p["grad_bytes_per_param"], p["update_bytes_per_param"])

    prows = prediction_rows(BF16_WIRE, False)
    print("\n".join(text_table(pheads, prows)))
    crows = []
    if compressed:
        print(f"\nThe same with compressed communication: {wire_words(args)}; tokens/s per GPU (gain over bf16)")
        crows = prediction_rows(wire_of(args), True)
        print("\n".join(text_table(pheads, crows)))

    if args.json:
        with open(args.json, "w") as f:
            for r in out_json:
                f.write(json.dumps(r) + "\n")
        print(f"JSON lines written to {args.json}")
    if args.markdown:
        md = ["### Measured against the model", ""] + (md_table(heads, rows) if rows else ["(no points)"])
        if points:
            md += ["", verdict[0].upper() + verdict[1:] + "."]
        md += ["", f"### Predicted tokens/s per GPU (share of one GPU), 1-{HOSTS[-1]} hosts x {GPUS_PER_HOST} GPUs",
               "", f"Network {args.nic_gbit:g} Gb/s per GPU at {args.net_efficiency:g} efficiency, "
               f"{args.net_latency_us:g} us; Z = ZeRO stage, flat = one ring over all GPUs, "
               "host = --shard-over host.", ""] + md_table(pheads, prows)
        if compressed:
            md += ["", f"### The same with compressed communication (gain over bf16)", "",
                   wire_words(args)[0].upper() + wire_words(args)[1:] + ".", ""] + md_table(pheads, crows)
        with open(args.markdown, "w") as f:
            f.write("\n".join(md) + "\n")
        print(f"Markdown written to {args.markdown}")
    if args.plot:
        plot(args.plot, preds, points)


if __name__ == "__main__":
    main()
