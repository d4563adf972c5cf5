#!/usr/bin/env python3
"""Tokenize text into the token shards that llmc/dataloader.h reads.

    python3 data/prepare.py                       # default corpus: KJV Bible + fortunes
    python3 data/prepare.py my_texts/ notes.txt   # your own files and folders
    python3 data/prepare.py web.jsonl.zst books/  # JSON lines and parquet too, gzip or zstd compressed or not
    python3 data/prepare.py my_texts/ --resume    # continue an interrupted run
    python3 data/prepare.py --check data/shards/corpus_val_000000.bin

It streams: memory is bounded by --buffer-mb, not by the corpus; --workers processes tokenize, and the shards are
the same for any number of them. The shard format and every option are described in docs/shard_format.md.
Needs `pip install tiktoken` and `pip install --no-deps llama-models` (the Llama 3 tokenizer file), and
`pip install zstandard pyarrow` for .zst and .parquet inputs; the default corpus needs
`apt-get install bible-kjv fortunes`.
"""

import argparse
import base64
import codecs
import collections
import contextlib
import gzip
import hashlib
import importlib.util
import io
import json
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from array import array
from dataclasses import dataclass

MAGIC = 0x4C4C5453
VERSION = 1         # tokens
VERSION_MASKED = 2  # tokens, then a loss mask of one byte per token (1: predicting this token counts)
HEADER_BYTES = 1024
HEADER_STRUCT = struct.Struct("<iiiiQii")  # the used prefix of the 256 x int32 header

DEFAULT_OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shards")
FORTUNES_DIR = "/usr/share/games/fortunes"

# tiktoken panics on very long inputs and very long runs of (non-)whitespace
# (https://github.com/openai/tiktoken/issues/195); these are the limits that
# llama_models/llama3/tokenizer.py uses.
TIKTOKEN_MAX_ENCODE_CHARS = 400_000
MAX_NO_WHITESPACES_CHARS = 25_000
_LONG_RUN = re.compile(r"\S{%d,}|\s{%d,}" % (MAX_NO_WHITESPACES_CHARS + 1, MAX_NO_WHITESPACES_CHARS + 1))

LLAMA3_PAT_STR = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"  # noqa: E501
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def llama3_special_tokens(num_base_tokens):
    """The 256 special tokens in the order of llama_models/llama3/tokenizer.py."""
    named = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|step_id|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
        "<|image|>",
    ]
    reserved = [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(named))]
    return {token: num_base_tokens + i for i, token in enumerate(named + reserved)}


# The tokenizer files are taken from PyPI packages because nothing else can be
# downloaded at run time here; the hash pins the exact ranks the shards encode.
TOKENIZERS = {
    "llama3": {
        "package": "llama_models",
        "pip": "llama-models",
        "file": "llama3/tokenizer.model",
        "sha256": "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",
        "pat_str": LLAMA3_PAT_STR,
        "specials": llama3_special_tokens,
        "bos": "<|begin_of_text|>",
        "eos": "<|end_of_text|>",
    },
    # openai-whisper ships GPT-2's BPE ranks (identical to tiktoken's r50k_base).
    "gpt2": {
        "package": "whisper",
        "pip": "openai-whisper",
        "file": "assets/gpt2.tiktoken",
        "sha256": "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
        "pat_str": GPT2_PAT_STR,
        "specials": lambda n: {"<|endoftext|>": n},
        "bos": "<|endoftext|>",
        "eos": "<|endoftext|>",
    },
}


class PrepareError(Exception):
    """A problem with the inputs or the environment: reported as one message, no traceback."""


@dataclass
class Tokenizer:
    name: str
    encoding: object  # tiktoken.Encoding
    vocab_size: int
    bos_id: int
    eos_id: int
    path: str = ""  # the tiktoken file, copied beside the shards for the trainers' samples and exports
    specials: dict = None  # special token -> id


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_tokenizer_path(kind):
    info = TOKENIZERS[kind]
    spec = importlib.util.find_spec(info["package"])
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError(
            f"the {kind} tokenizer file comes from the PyPI package {info['pip']}, which is not installed\n"
            f"  fix: pip install --no-deps {info['pip']}   (or pass --tokenizer-model PATH)")
    return os.path.join(spec.submodule_search_locations[0], info["file"])


def load_tokenizer(kind="llama3", path=None):
    info = TOKENIZERS[kind]
    path = path or default_tokenizer_path(kind)
    if not os.path.isfile(path):
        raise PrepareError(
            f"tokenizer file not found: {path}\n"
            f"  fix: pip install --force-reinstall --no-deps {info['pip']}, or pass --tokenizer-model PATH")
    found = sha256_of(path)
    if found != info["sha256"]:
        raise PrepareError(
            f"tokenizer file {path} is not the {kind} tokenizer\n"
            f"  expected sha256 {info['sha256']}\n"
            f"  found    sha256 {found}\n"
            f"  fix: pip install --force-reinstall --no-deps {info['pip']}, "
            f"or pass --tokenizer-model with the file from that package")
    try:
        import tiktoken
    except ImportError:
        raise PrepareError("the Python package tiktoken is not installed\n  fix: pip install tiktoken") from None
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    specials = info["specials"](len(ranks))
    encoding = tiktoken.Encoding(name=f"{kind}:{os.path.basename(path)}", pat_str=info["pat_str"],
                                 mergeable_ranks=ranks, special_tokens=specials)
    return Tokenizer(kind, encoding, encoding.n_vocab, specials[info["bos"]], specials[info["eos"]], path, specials)


class ResumableError(PrepareError):
    """A problem of the machine, not of the inputs (a full disk, a worker killed): the complete shards stay, and
    --resume continues once it is fixed."""


class Interrupted(Exception):
    """SIGTERM, raised in the main process like Ctrl-C's KeyboardInterrupt so that the same cleanup runs."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


# ---------------------------------------------------------------- encoding

# A run of more than MAX_NO_WHITESPACES_CHARS (non-)whitespace characters holds a whole aligned block of half as
# many; looking at those blocks first spares the slow regex search in almost every text.
_RUN_PROBE = MAX_NO_WHITESPACES_CHARS // 2


def _may_have_long_run(text):
    for start in range(0, len(text) - _RUN_PROBE + 1, _RUN_PROBE):
        block = text[start:start + _RUN_PROBE]
        if block.isspace() or len(block.split(None, 1)[0]) == _RUN_PROBE:
            return True
    return False


def _split_long_runs(text):
    if not _may_have_long_run(text) or not _LONG_RUN.search(text):
        return [text]
    pieces, start = [], 0
    for run in _LONG_RUN.finditer(text):
        for cut in range(run.start() + MAX_NO_WHITESPACES_CHARS, run.end(), MAX_NO_WHITESPACES_CHARS):
            pieces.append(text[start:cut])
            start = cut
    pieces.append(text[start:])
    return pieces


def cut_pieces(segments):
    """The text of one document, given as consecutive segments, cut into pieces of at most TIKTOKEN_MAX_ENCODE_CHARS
    where the token stream is least affected. Each cut depends only on the text up to it, so a document read in
    parts is cut as if it were read whole."""
    text = ""
    for segment in segments:
        text += segment
        start = 0
        while len(text) - start > TIKTOKEN_MAX_ENCODE_CHARS:
            end = start + TIKTOKEN_MAX_ENCODE_CHARS
            cut = text.rfind("\n", start, end) + 1  # after a newline: a pre-token boundary
            if cut <= start:
                cut = text.rfind(" ", start + 1, end)  # before a space, which belongs to the next word
            if cut <= start:
                cut = end
            yield text[start:cut]
            start = cut
        text = text[start:]
    yield text


def encodable_pieces(text):
    """Split text into pieces tiktoken can encode, cutting where the token stream is least affected."""
    return [piece for window in cut_pieces((text,)) for piece in _split_long_runs(window)]


def encode_text(tokenizer, text):
    tokens = []
    for piece in encodable_pieces(text):
        tokens.extend(tokenizer.encoding.encode_ordinary(piece))
    return tokens


# ---------------------------------------------------------------- tokenizer workers

# What a worker task's item is (a byte each, sent with the task). Documents of text files go as their raw bytes, JSON
# lines as theirs: decoding, parsing and checking them is the workers' work, which keeps the main process light.
ITEM_PIECE = 0  # str: the next piece of the document begun before (decoded with surrogateescape, as ITEM_TEXT)
ITEM_TEXT = 1   # str: a document, or the first piece of a long one; from a file, decoded with surrogateescape
ITEM_BYTES = 2  # bytes: a document of a text file, UTF-8
ITEM_JSON = 3   # bytes or str: a JSON line (or a parquet row as JSON): a --text-field document, or an example
ITEM_VALUE = 4  # the --text-field value of a parquet row: a document if it is a string (or UTF-8 bytes)


class _Replaced:
    """The tally of the invalid UTF-8 that the last decode() replaced with U+FFFD: count, and the first one's reason
    and byte offset."""
    count, first = 0, None


def _replace_and_count(error):
    if not _Replaced.count:
        _Replaced.first = (error.reason, error.start)
    _Replaced.count += 1
    return "\ufffd", error.end


codecs.register_error("prepare.replace_and_count", _replace_and_count)


class TaskEncoder:
    """Tokenizes tasks in a worker process. A task is (kinds, items): see ITEM_*. The result is the tokens (bytes,
    little-endian), where each item's tokens begin (and their total), the loss mask of examples (bytes), and events:
    (item, "replaced", count, (reason, offset)) for invalid UTF-8, (item, "skipped", why, what) for a record that is
    not a document. An item that begins a document and gets no tokens is no document: only whitespace, or skipped."""

    def __init__(self, tokenizer, fmt, typecode, text_field):
        self.tokenizer, self.fmt, self.typecode, self.text_field = tokenizer, fmt, typecode, text_field
        # for tiktoken's encode_to_numpy: imported before the workers are forked, so that they share its pages
        # (imported by each, 16 workers held 0.25 GB more; here it costs the main process 0.7 s at start)
        require_module("numpy", "numpy", "tokenizing")
        import numpy
        self.dtype = numpy.dtype(numpy.uint16 if typecode == "H" else numpy.uint32)

    def _encoded(self, text):
        """The tokens of text (special tokens' text as text, as encode_ordinary), as the bytes of the shards' items.
        tiktoken's buffer spares the Python int per token of encode_ordinary's list: 12-14% more tokens per CPU
        second in a worker."""
        codes = self.tokenizer.encoding.encode_to_numpy(text, disallowed_special=())
        return memoryview(codes.astype(self.dtype, copy=False)).cast("B")

    def encode(self, kinds, items):
        tokens, offsets = array(self.typecode), array("q")
        mask = None if self.fmt == "text" else bytearray()
        events = []
        for i, (kind, item) in enumerate(zip(kinds, items)):
            offsets.append(len(tokens))
            document = self._document(i, kind, item, events)
            if document is None:
                continue
            if mask is not None:
                example, example_mask = encode_example(self.tokenizer, document, self.fmt)
                tokens.extend(example)
                mask.extend(example_mask)
                continue
            if kind != ITEM_PIECE:
                tokens.append(self.tokenizer.bos_id)
            for piece in encodable_pieces(document):
                tokens.frombytes(self._encoded(piece))
        offsets.append(len(tokens))
        if sys.byteorder != "little":
            tokens.byteswap()
        return tokens.tobytes(), offsets, None if mask is None else bytes(mask), events

    def _decode(self, i, data, events):
        _Replaced.count = 0
        text = data.decode("utf-8", "prepare.replace_and_count")
        if _Replaced.count:
            events.append((i, "replaced", _Replaced.count, _Replaced.first))
        return text

    def _document(self, i, kind, item, events):
        """The text of a document (or the record of an example), or None."""
        if kind in (ITEM_PIECE, ITEM_TEXT):
            # invalid UTF-8 was kept as surrogates to cut the text where its characters are; replaced now
            return item if item.isascii() else self._decode(i, item.encode("utf-8", "surrogateescape"), events)
        if kind == ITEM_BYTES:
            text = self._decode(i, item, events)
            return text if text and not text.isspace() else None
        if kind == ITEM_VALUE:
            if isinstance(item, tuple):  # the parquet file has no such column: these are its columns
                events.append((i, "skipped", f'without a string "{self.text_field}"',
                               f'no column "{self.text_field}"; the columns are {list(item)}'))
                return None
            record = {self.text_field: self._decode(i, item, events) if isinstance(item, bytes) else item}
        else:
            try:
                record = json.loads(self._decode(i, item, events) if isinstance(item, bytes) else item)
            except ValueError as e:
                events.append((i, "skipped", "that are not JSON", f"not JSON: {e}"))
                return None
        if self.fmt != "text":
            problem = example_problem(record, self.fmt)
            if problem:
                events.append((i, "skipped", f"that are not --format {self.fmt} examples", problem))
                return None
            return record
        text = record.get(self.text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            what = (f"a JSON {type(record).__name__}, not an object" if not isinstance(record, dict) else
                    f'no string "{self.text_field}"; the keys are {sorted(record)}' if kind == ITEM_JSON else
                    f'"{self.text_field}" is {type(text).__name__}, not a string')
            events.append((i, "skipped", f'without a string "{self.text_field}"', what))
            return None
        return text if text and not text.isspace() else None


def _exit_with_parent(parent):
    # a worker killed with its parent leaves nothing running
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


def _worker_main(conn, parent_ends, encoder):
    for end in parent_ends:  # inherited by the fork: the main process alone holds them, so that EOF comes through
        end.close()
    # Ctrl-C signals the whole process group: the main process handles it, and SIGTERM, and stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    # Tasks are taken in, and results sent, by threads of their own: the main process, which takes the results in
    # task order, may be reading another worker's, and this one goes on tokenizing meanwhile (with one thread,
    # workers waited to send a sixth of the time); nor can the main process wait to send a task while this one
    # waits to send a result, each for the other. At most TASKS_PER_WORKER tasks are in flight per worker, so
    # neither queue grows past that.
    tasks, results = queue.Queue(), queue.Queue()

    def take_in():
        try:
            while True:
                tasks.put(conn.recv_bytes())
        except (EOFError, OSError):
            tasks.put(None)

    def send_out():
        while (result := results.get()) is not None:
            try:
                conn.send_bytes(result)
            except OSError:  # the main process stopped (Ctrl-C, an error) and closed the pipe
                return

    threading.Thread(target=take_in, daemon=True).start()
    sender = threading.Thread(target=send_out)
    sender.start()
    while (task := tasks.get()) is not None:
        try:
            result = encoder.encode(*pickle.loads(task))
        except Exception:  # a bug: reported by the main process
            result = RuntimeError("a tokenizer worker failed:\n" + traceback.format_exc())
        results.put(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
    results.put(None)
    sender.join()


WORKER_DIED = "a tokenizer worker process died (out of memory? killed?)"


class WorkerPool:
    """Tokenizer processes, each with its own pipe. A task goes to the worker with the fewest in flight, and results
    are taken in from whichever worker has one ready, then handed out in task order. (Dealt round-robin and taken
    back in turn, every worker went at the pace of the slowest: a task whose text tokenizes slowly, or a core shared
    with the main process, held up the whole pool, and 16 workers were busy 80% of the time.) Forked: the workers
    share the tokenizer that the main process loaded."""

    def __init__(self, workers, encoder):
        context = multiprocessing.get_context("fork")
        self.conns, self.processes = [], []
        for _ in range(workers):
            ours, theirs = context.Pipe()
            process = context.Process(target=_worker_main, args=(theirs, self.conns + [ours], encoder), daemon=True)
            process.start()
            theirs.close()
            self.conns.append(ours)
            self.processes.append(process)
        self.in_flight = [collections.deque() for _ in range(workers)]  # each worker's task numbers, oldest first
        self.ready = {}  # results taken in before their turn, by task number
        self.sent = self.received = 0

    def send(self, task):
        """Hand task to the worker with the fewest in flight, once one has fewer than TASKS_PER_WORKER."""
        self._take_in(timeout=0)
        while True:
            worker = min(range(len(self.conns)), key=lambda w: len(self.in_flight[w]))
            if len(self.in_flight[worker]) < TASKS_PER_WORKER:
                break
            self._take_in(timeout=None)
        try:
            self.conns[worker].send_bytes(pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            raise ResumableError(WORKER_DIED) from None
        self.in_flight[worker].append(self.sent)
        self.sent += 1

    def receive(self):
        """The result of the oldest task sent and not received."""
        while self.received not in self.ready:
            self._take_in(timeout=None)
        result = self.ready.pop(self.received)
        self.received += 1
        if isinstance(result, Exception):
            raise result
        return result

    def _take_in(self, timeout):
        """Take in the results the workers have sent; wait up to timeout seconds (None: any time) for the first."""
        busy = [conn for conn, tasks in zip(self.conns, self.in_flight) if tasks]
        for conn in multiprocessing.connection.wait(busy, timeout):
            try:
                result = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                raise ResumableError(WORKER_DIED) from None
            self.ready[self.in_flight[self.conns.index(conn)].popleft()] = result

    def close(self):
        for conn in self.conns:
            conn.close()
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()


# ---------------------------------------------------------------- inputs

COMPRESSIONS = (".gz", ".zst")
READ_BYTES = 1 << 20  # text files are read and split this much at a time
TEXT_CHECK_BYTES = 8192  # the head of a file in a folder that decides whether it is text
PARQUET_BATCH_ROWS = 64  # rows taken from pyarrow at a time: more (1024) took it 300 MB more memory


def input_format(path):
    """How a file is read, from its name: ("jsonl" (.jsonl or .json: a JSON object a line), "parquet" or "text",
    and the compression: ".gz", ".zst" or "")."""
    stem, ext = os.path.splitext(path.lower())
    compression = ext if ext in COMPRESSIONS else ""
    if compression:
        stem, ext = os.path.splitext(stem)
    if ext in (".jsonl", ".json"):
        return "jsonl", compression
    return ("parquet" if ext == ".parquet" else "text"), compression


@contextlib.contextmanager
def opened_input(path, compression, buffer_bytes=READ_BYTES):
    """(the decompressed byte stream, the file under it, whose position says how much of the input was read)."""
    # Buffers of READ_BYTES, not io's 8 KiB: a JSON line is read by the line, and long lines through small buffers
    # made the main process's reader thread the slowest part of a 16-worker run (2.2-2.8 GB/s of this corpus's JSON
    # lines on one core with 1 MiB, 0.6-1.4 with 8 KiB; through igzip 0.82 against 0.61-0.72, zstd 1.08 against 0.94).
    with open(path, "rb", buffering=buffer_bytes) as raw:
        if compression == ".gz":
            yield io.BufferedReader(gzip_reader(raw), buffer_bytes), raw
        elif compression == ".zst":
            import zstandard
            reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
            yield io.BufferedReader(reader, buffer_bytes), raw
        else:
            yield raw, raw


def gzip_reader(raw):
    """The decompressed stream of a .gz file: through python-isal's igzip where it is installed (the main process
    reads a .gz input, and with many workers it is what they wait for: igzip read this corpus's JSON lines at 700 MB/s,
    the standard library's gzip at 270), else through gzip."""
    try:
        from isal import igzip
    except ImportError:
        return gzip.GzipFile(fileobj=raw, mode="rb")
    return igzip.IGzipFile(fileobj=raw, mode="rb")


def read_errors():
    """What reading a bad input file raises: an I/O error, a corrupt gzip, zstd or parquet file."""
    errors = [OSError, EOFError, zlib.error]
    for module, name in (("zstandard", "ZstdError"), ("pyarrow", "ArrowException"), ("isal.isal_zlib", "error")):
        if module in sys.modules:
            errors.append(getattr(sys.modules[module], name))
    return tuple(errors)


def _looks_like_text(path):
    compression = input_format(path)[1]
    if compression == ".zst":
        require_module("zstandard", "zstandard", f"reading {path}")
    try:
        with opened_input(path, compression, TEXT_CHECK_BYTES) as (stream, _):  # what is read, not a whole buffer
            head = stream.read(TEXT_CHECK_BYTES)
    except read_errors() as e:
        raise PrepareError(f"cannot read {path}: {e}") from None
    if b"\0" in head:
        return False
    try:
        codecs.utf_8_decode(head, "strict", False)  # not final: the 8 KiB may end inside a character
    except UnicodeDecodeError:
        return False
    return True


def find_input_files(paths):
    """Named files as given, plus what is under named folders (sorted, hidden entries skipped): JSON lines and
    parquet files by their names, and the files that look like UTF-8 text (once decompressed)."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(names):
                    full = os.path.join(root, name)
                    if (not name.startswith(".") and os.path.isfile(full)
                            and (input_format(full)[0] != "text" or _looks_like_text(full))):
                        files.append(full)
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise PrepareError(f"input path not found: {path}\n  fix: pass existing files or folders")
    if not files:
        raise PrepareError(f"no text files found in: {' '.join(paths)}")
    return files


def require_module(module, pip, why):
    if importlib.util.find_spec(module) is None:
        raise PrepareError(f"{why} needs the Python package {module}, which is not installed\n  fix: pip install {pip}")


def check_input_files(files, fmt):
    """Fail before anything is written on a file that cannot be read, or not as fmt."""
    for path in files:
        kind, compression = input_format(path)
        if kind == "parquet" and compression:
            raise PrepareError(f"{path}: parquet compresses inside the file; a compressed parquet file is not read\n"
                               f"  fix: decompress it")
        if fmt != "text" and kind == "text":
            raise PrepareError(f"{path}: --format {fmt} reads JSON lines (.jsonl, .json) or parquet files")
        if compression == ".zst":
            require_module("zstandard", "zstandard", f"reading {path}")
        if kind == "parquet":
            require_module("pyarrow", "pyarrow", f"reading {path}")
        try:
            open(path, "rb").close()
        except OSError as e:
            raise PrepareError(f"cannot read {path}: {e.strerror}") from None


def _only_whitespace(doc):
    """Whether UTF-8 bytes are only whitespace as str.isspace() sees it, mostly without decoding them."""
    rest = doc.lstrip()  # ASCII whitespace
    if not rest:
        return True
    if rest[0] < 0x80 and not 0x1c <= rest[0] <= 0x1f:  # neither ASCII whitespace nor the start of other whitespace
        return False
    return doc.decode("utf-8", "surrogateescape").isspace()


# The separators as splits of bytes that cut where split_documents' re.split(r"\r?\n...") cuts, but at the "\n": a
# pattern that begins with a plain character is found many times faster. The "\r" before that "\n", which the
# separator would take, is dropped from the end of the document before it.
STREAM_SPLITS = {"line": lambda data: data.split(b"\n"), "blank": re.compile(rb"\n[ \t]*\r?\n").split}


class DocumentSplitter:
    """The documents of one file's bytes, fed in consecutive pieces, as events: ("doc", bytes) for each document
    that split_documents finds in the whole (decoded) text, but ("begin", bytes), ("part", bytes)..., ("end", bytes)
    for one longer than huge_bytes, which is never held whole."""

    def __init__(self, separator, huge_bytes):
        self.split = STREAM_SPLITS.get(separator)  # None: the whole text is one document
        self.huge_bytes = huge_bytes
        self.doc, self.size = [], 0  # the current document's bytes so far
        self.streaming = False  # the current document is being handed on in parts
        self.tail = b""  # the bytes from the last "\n" on, where a separator may begin that the next piece ends

    def feed(self, data):
        if self.split is None:
            yield from self._extend(data)
            return
        pieces = self.split(self.tail + data)
        for piece in pieces[:-1]:
            yield from self._end(piece, separated=True)
        rest = pieces[-1]
        cut = rest.rfind(b"\n")
        cut = len(rest) if cut < 0 else cut
        self.tail = rest[cut:]
        yield from self._extend(rest[:cut])

    def finish(self):
        yield from self._end(self.tail, separated=False)
        self.tail = b""

    def _extend(self, data):
        self.doc.append(data)
        self.size += len(data)
        if self.streaming or self.size > self.huge_bytes:
            data = b"".join(self.doc)
            # a "\r" at the end is dropped if a separator follows: held back until that is known
            held = b"\r" if self.split is not None and data.endswith(b"\r") else b""
            yield ("part" if self.streaming else "begin"), data[:len(data) - len(held)]
            self.streaming = True
            self.doc, self.size = [held], len(held)

    def _end(self, data, separated):
        self.doc.append(data)
        doc = b"".join(self.doc)
        if separated and doc.endswith(b"\r"):
            doc = doc[:-1]
        self.doc, self.size = [], 0
        if self.streaming:
            # begun before its end was seen, so written even if it is only whitespace
            self.streaming = False
            yield "end", doc
        elif not _only_whitespace(doc):
            yield "doc", doc


def split_documents(text, separator):
    if separator == "file":
        docs = [text]
    elif separator == "blank":
        docs = re.split(r"\r?\n[ \t]*\r?\n", text)
    elif separator == "line":
        docs = re.split(r"\r?\n", text)
    else:
        docs = re.split(separator[len("regex:"):], text, flags=re.MULTILINE)
    return [d for d in docs if d.strip()]


class Source:
    """The documents of the input files, in the order of the files, as events (kind, data, origin): kind an ITEM_*
    for a document (or a record that may be one), or "begin", "part"..., "end" for the bytes of a text document too
    long to hold (over huge_bytes), in parts. origin is (the file's index, the line of a JSON line or the row of a
    parquet file, else 0). bytes_read() tells how much of the input is read, for the progress."""

    def __init__(self, files, fmt, separator, text_field, huge_bytes):
        self.files, self.fmt, self.separator, self.text_field = files, fmt, separator, text_field
        self.huge_bytes = huge_bytes
        self.stat = [os.stat(path) for path in files]
        self.total_bytes = sum(st.st_size for st in self.stat)
        self._done_bytes = 0  # of the files read to their end
        self._tell = lambda: 0  # bytes read of the current file

    def describe(self):
        return f"{len(self.files):,} file(s), {format_bytes(self.total_bytes)}"

    def identity(self):
        """What a resumed run must find unchanged."""
        return [[os.path.abspath(path), st.st_size, st.st_mtime_ns] for path, st in zip(self.files, self.stat)]

    def where(self, origin, line=True):
        """The file (and line, or parquet row) of an origin."""
        path = self.files[origin[0]]
        kind = input_format(path)[0]
        if not line or kind == "text":
            return path
        return f"{path}:{origin[1]}" if kind == "jsonl" else f"{path} row {origin[1]}"

    def bytes_read(self):
        return self._done_bytes + self._tell()

    def events(self):
        for index, (path, st) in enumerate(zip(self.files, self.stat)):
            kind, compression = input_format(path)
            try:
                if kind == "parquet":
                    yield from self._parquet(index, path, st.st_size)
                elif kind == "jsonl":
                    yield from self._jsonl(index, path, compression)
                else:
                    yield from self._text(index, path, compression)
            except read_errors() as e:
                raise PrepareError(f"cannot read {path}: {e}") from None
            self._done_bytes += st.st_size
            self._tell = lambda: 0

    def _text(self, index, path, compression):
        with opened_input(path, compression) as (stream, raw):
            self._tell = raw.tell
            if self.separator.startswith("regex:"):
                # a regex may match across any cut: the file is split whole, as text; invalid UTF-8 goes through as
                # surrogates, back to the bytes it was, for the workers to replace and count
                text = stream.read().decode("utf-8", "surrogateescape")
                for doc in split_documents(text, self.separator):
                    yield ITEM_BYTES, doc.encode("utf-8", "surrogateescape"), (index, 0)
                return
            splitter = DocumentSplitter(self.separator, self.huge_bytes)
            while data := stream.read(READ_BYTES):
                for kind, doc in splitter.feed(data):
                    yield (ITEM_BYTES if kind == "doc" else kind), doc, (index, 0)
            for kind, doc in splitter.finish():
                yield (ITEM_BYTES if kind == "doc" else kind), doc, (index, 0)

    def _jsonl(self, index, path, compression):
        with opened_input(path, compression) as (stream, raw):
            self._tell = raw.tell
            for lineno, line in enumerate(stream, 1):
                if not line.isspace():
                    yield ITEM_JSON, line, (index, lineno)

    def _parquet(self, index, path, size):
        import pyarrow as pa
        import pyarrow.parquet as pq
        # Arrow's own allocator keeps what reading a row group took; the system's gives it back
        pa.set_memory_pool(pa.system_memory_pool())
        with open(path, "rb") as raw:
            parquet = pq.ParquetFile(raw, pre_buffer=False)
            rows = parquet.metadata.num_rows
            row = 0
            self._tell = lambda: size * row // max(rows, 1)
            if self.fmt == "text" and self.text_field not in parquet.schema_arrow.names:
                # every row is a record without the field: each is counted, the first named, by the workers
                columns = tuple(parquet.schema_arrow.names)
                for row in range(1, rows + 1):
                    yield ITEM_VALUE, columns, (index, row)
                return
            columns = [self.text_field] if self.fmt == "text" else None
            for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns, use_threads=False):
                if self.fmt == "text":
                    column = batch.column(0)
                    # as their UTF-8 bytes (a cast that copies nothing): a str would take up to 4 bytes a character
                    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                        column = column.cast(pa.large_binary())
                    for value in column.to_pylist():
                        row += 1
                        yield ITEM_VALUE, value, (index, row)
                else:
                    for record in batch.to_pylist():
                        row += 1
                        yield ITEM_JSON, json.dumps(record, default=str), (index, row)


class DefaultCorpus(Source):
    """The default corpus (KJV Bible and fortunes), read into memory (7 MB) up front."""

    def __init__(self):
        self.docs = default_corpus_documents()
        self.total_bytes = sum(map(len, self.docs))
        self.read = 0

    def describe(self):
        return f"the default corpus (KJV Bible, fortunes), {format_bytes(self.total_bytes)}"

    def identity(self):
        return [["default corpus", len(self.docs), self.total_bytes]]

    def where(self, origin, line=True):
        return "the default corpus"

    def bytes_read(self):
        return self.read

    def events(self):
        for i, doc in enumerate(self.docs):
            self.read += len(doc)
            yield ITEM_TEXT, doc, (0, i)


class InputStats:
    """Input problems that need not stop a run, as the workers find them: invalid UTF-8 (replaced with U+FFFD) and
    records skipped, counted for the summary with the first place (in input order) of each. With strict, the first
    one found is an error."""

    def __init__(self, source, strict):
        self.source, self.strict = source, strict
        self.replaced = [0, None]  # byte sequences, the origin of the first document with any
        self.skipped = {}  # why -> [records, the origin of the first, what is wrong with it]
        self.changes = 0

    def add(self, event, origin):
        self.changes += 1
        if event[0] == "replaced":
            _, count, (reason, offset) = event
            if self.strict:
                where = self.source.where(origin)
                of = "a document" if where == self.source.where(origin, line=False) else "the record"
                raise PrepareError(f"{where}: not UTF-8 ({reason} at byte {offset:,} of {of})\n"
                                   f"  fix: convert it (iconv -t utf-8), or drop --strict to replace such bytes "
                                   f"with U+FFFD")
            self.replaced[0] += count
            if self.replaced[1] is None or origin < tuple(self.replaced[1]):
                self.replaced[1] = origin
            return
        _, why, what = event
        if self.strict:
            raise PrepareError(f"{self.source.where(origin)}: {what}\n  fix: mend or leave out that record, or drop "
                               f"--strict to skip such records")
        entry = self.skipped.setdefault(why, [0, origin, what])
        entry[0] += 1
        if origin < tuple(entry[1]):
            entry[1:] = [origin, what]

    def state(self):
        """A copy, for the state file."""
        return json.loads(json.dumps({"replaced": self.replaced, "skipped": self.skipped}))

    def restore(self, state):
        self.replaced = state["replaced"]
        self.skipped = state["skipped"]

    def lines(self):
        lines = []
        if self.replaced[0]:
            lines.append(f"invalid UTF-8: {self.replaced[0]:,} byte sequence(s) replaced with U+FFFD "
                         f"(first in {self.source.where(self.replaced[1], line=False)})")
        for why, (count, origin, what) in self.skipped.items():
            lines.append(f"skipped {count:,} record(s) {why} (first: {self.source.where(origin)}: {what})")
        return lines


_HEADING = re.compile(r"^(\S.*) (\d+)$")
_VERSE = re.compile(r"^\s+(\d+) (.*)$")


def bible_books(text):
    """One document per book of `bible gen1:1-rev22:21` output, one line per verse.

    The command prints a blank line, "Book N", a blank line, then verses as
    "  N text" wrapped at 80 columns with unindented continuation lines.
    """
    books, book, chapter = [], None, None
    previous_blank = True
    for line in text.splitlines():
        heading = _HEADING.match(line) if previous_blank else None
        previous_blank = not line.strip()
        if heading:
            if heading.group(1) != book:
                book = heading.group(1)
                books.append([])
            chapter = [line, ""]
            books[-1].append(chapter)
        elif chapter is None or not line.strip():
            continue
        elif _VERSE.match(line):
            chapter.append(" ".join(_VERSE.match(line).groups()))
        else:
            chapter[-1] += " " + line.strip()
    return ["\n\n".join("\n".join(ch) for ch in chapters) + "\n" for chapters in books]


_OVERSTRIKE = re.compile("[^\b]\b", re.DOTALL)


def strip_overstrike(text):
    """Drop the backspace overstrikes of terminal underline and bold ("_<BS>A", "A<BS>A", "__<BS><BS>AB")."""
    while True:
        plain = _OVERSTRIKE.sub("", text)
        if plain == text:
            return plain.replace("\b", "")
        text = plain


def fortune_documents(folder=FORTUNES_DIR):
    """One document per fortune, from the '%'-separated files that have a .dat index beside them."""
    docs = []
    if not os.path.isdir(folder):
        return docs
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if "." in name or os.path.islink(path) or not os.path.isfile(path + ".dat"):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = strip_overstrike(f.read())
        docs.extend(d for d in re.split(r"^%\n", text, flags=re.MULTILINE) if d.strip())
    return docs


def default_corpus_documents():
    bible = shutil.which("bible")
    if bible is None:
        raise PrepareError(
            "no input given, and the default corpus needs the `bible` command, which is missing\n"
            "  fix: apt-get install bible-kjv fortunes   (or pass your own text files or folders)")
    result = subprocess.run([bible, "gen1:1-rev22:21"], stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, check=False)
    books = bible_books(result.stdout)
    if result.returncode != 0 or len(books) != 66:
        raise PrepareError(
            f"`bible gen1:1-rev22:21` exited with {result.returncode} and gave {len(books)} books, not 66: "
            f"{result.stderr.strip()}\n  fix: apt-get install --reinstall bible-kjv")
    fortunes = fortune_documents()
    if not fortunes:
        print(f"note: no fortunes in {FORTUNES_DIR}; using the Bible only (apt-get install fortunes adds more)",
              file=sys.stderr)
    return books + fortunes


# ---------------------------------------------------------------- shards

def shard_path(out_dir, name, split, index):
    return os.path.join(out_dir, f"{name}_{split}_{index:06d}.bin")


def bytes_per_token(vocab_size):
    return 2 if vocab_size <= 65536 else 4


class ShardFile:
    """One shard, written as its tokens come: to PATH.tmp, which no *.bin glob matches, renamed to PATH when
    complete, so that a reader never sees a half-written shard. The header, which holds the token count, is written
    last; so is the loss mask (version 2), which follows all the tokens and waits in an unnamed temporary file."""

    def __init__(self, path, tokenizer, itemsize, masked):
        self.path, self.tokenizer, self.itemsize = path, tokenizer, itemsize
        self.count = 0
        self.file = open(path + ".tmp", "wb")
        self.file.write(bytes(HEADER_BYTES))
        self.mask = tempfile.TemporaryFile(dir=os.path.dirname(path) or ".") if masked else None

    def write(self, tokens, mask=None):
        """tokens: little-endian bytes; mask: a byte per token, given exactly when the shard is masked."""
        if (mask is None) != (self.mask is None) or (mask is not None and len(mask) * self.itemsize != len(tokens)):
            raise ValueError("a masked shard takes a mask byte with every token, an unmasked one none")
        self.file.write(tokens)
        self.count += len(tokens) // self.itemsize
        if mask is not None:
            self.mask.write(mask)

    def close(self):
        if self.mask is not None:
            self.mask.seek(0)
            shutil.copyfileobj(self.mask, self.file)
            self.mask.close()
        self.file.seek(0)
        self.file.write(HEADER_STRUCT.pack(MAGIC, VERSION if self.mask is None else VERSION_MASKED, self.itemsize,
                                           self.tokenizer.vocab_size, self.count, self.tokenizer.bos_id,
                                           self.tokenizer.eos_id))
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.path + ".tmp", self.path)

    def abort(self):
        self.file.close()
        if self.mask is not None:
            self.mask.close()
        if os.path.exists(self.path + ".tmp"):
            os.remove(self.path + ".tmp")


def write_shard(path, tokens, tokenizer, mask=None):
    """Write a whole shard: header + tokens (an array) + the loss mask (one byte per token: version 2)."""
    if mask is not None and len(mask) != len(tokens):
        raise ValueError(f"{len(mask)} mask bytes for {len(tokens)} tokens")
    if sys.byteorder != "little":
        tokens = array(tokens.typecode, tokens)
        tokens.byteswap()
    shard = ShardFile(path, tokenizer, tokens.itemsize, mask is not None)
    try:
        shard.write(tokens.tobytes(), None if mask is None else bytes(mask))
        shard.close()
    except BaseException:
        shard.abort()
        raise


class SplitWriter:
    """Cuts one split's token stream (and, when masked, its loss mask) into shards of exactly shard_tokens tokens
    (the last one shorter): name_split_000000.bin, ..."""

    def __init__(self, out_dir, name, split, shard_tokens, tokenizer, itemsize, masked, written=()):
        self.out_dir, self.name, self.split = out_dir, name, split
        self.shard_tokens, self.tokenizer, self.itemsize, self.masked = shard_tokens, tokenizer, itemsize, masked
        self.written = list(written)  # (path, token count) of the complete shards
        self.shard = None

    def room(self):
        return self.shard_tokens - (self.shard.count if self.shard else 0)

    def write(self, tokens, mask=None):
        if self.shard is None:
            path = shard_path(self.out_dir, self.name, self.split, len(self.written))
            self.shard = ShardFile(path, self.tokenizer, self.itemsize, self.masked)
        self.shard.write(tokens, mask)

    def close(self):
        """Complete the shard being written, if any; True if there was one."""
        if self.shard is None:
            return False
        self.shard.close()
        self.written.append((self.shard.path, self.shard.count))
        self.shard = None
        return True

    def abort(self):
        if self.shard is not None:
            self.shard.abort()
            self.shard = None


def remove_shards(out_dir, name, keep=()):
    """Remove the shards of this name (and half-written ones, NAME.bin.tmp) but those in keep, so that a glob picks
    up no shard of another run; returns how many complete shards went."""
    pattern = re.compile(re.escape(name) + r"_(train|val)_\d{6}\.bin(\.tmp)?")
    removed = 0
    for entry in os.listdir(out_dir):
        path = os.path.join(out_dir, entry)
        if pattern.fullmatch(entry) and path not in keep:
            os.remove(path)
            removed += not entry.endswith(".tmp")
    return removed


def read_shard_header(path):
    """The header of a shard as a dict, after checking it and the file size; PrepareError if bad."""
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
        size = os.fstat(f.fileno()).st_size
    if len(raw) < HEADER_BYTES:
        raise PrepareError(f"{path}: {size} bytes, shorter than the {HEADER_BYTES}-byte header")
    magic, version, bpt, vocab_size, count, bos, eos = HEADER_STRUCT.unpack_from(raw)
    if magic != MAGIC:
        raise PrepareError(f"{path}: bad magic {magic & 0xFFFFFFFF:#010x}, expected {MAGIC:#010x}: not a token shard")
    if version not in (VERSION, VERSION_MASKED):
        raise PrepareError(f"{path}: unsupported version {version}, expected {VERSION} or {VERSION_MASKED}")
    if bpt not in (2, 4):
        raise PrepareError(f"{path}: bytes per token is {bpt}, expected 2 or 4")
    if count == 0:
        raise PrepareError(f"{path}: empty, the header says 0 tokens")
    each = bpt + (1 if version == VERSION_MASKED else 0)
    if size != HEADER_BYTES + count * each:
        raise PrepareError(f"{path}: file is {size} bytes but the header says {HEADER_BYTES} + {count} x {each}"
                           + (" (a token and its loss mask byte)" if version == VERSION_MASKED else ""))
    return {"version": version, "bytes_per_token": bpt, "vocab_size": vocab_size, "num_tokens": count,
            "bos_id": bos, "eos_id": eos}


def read_shard_mask(path, header):
    """The loss mask of a checked shard (bytes, one per token; None in a version 1 shard), read past its tokens."""
    if header["version"] != VERSION_MASKED:
        return None
    with open(path, "rb") as f:
        f.seek(HEADER_BYTES + header["num_tokens"] * header["bytes_per_token"])
        return f.read(header["num_tokens"])


def read_shard(path):
    """The header, the tokens and the loss mask (bytes; None in a version 1 shard)."""
    header = read_shard_header(path)
    tokens = array("H" if header["bytes_per_token"] == 2 else "I")
    with open(path, "rb") as f:
        f.seek(HEADER_BYTES)
        tokens.fromfile(f, header["num_tokens"])
    if sys.byteorder != "little":
        tokens.byteswap()
    return header, tokens, read_shard_mask(path, header)


def check_shards(paths):
    bad = 0
    for path in paths:
        try:
            h = read_shard_header(path)
        except (PrepareError, OSError) as e:
            print(f"BAD {e}")
            bad += 1
            continue
        counted = ""
        mask = read_shard_mask(path, h)
        if mask is not None:
            if max(mask) > 1:
                print(f"BAD {path}: loss mask bytes other than 0 and 1")
                bad += 1
                continue
            counted = f", loss on {sum(mask):,} of them"
        print(f"ok  {path}: version {h['version']}, uint{8 * h['bytes_per_token']} tokens, "
              f"vocab_size {h['vocab_size']}, {h['num_tokens']:,} tokens{counted}, bos {h['bos_id']}, eos {h['eos_id']}")
    return 1 if bad else 0


# ---------------------------------------------------------------- fine-tuning examples

CHAT_TOKENS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")


def example_problem(record, fmt):
    """What keeps record from being a fine-tuning example of fmt (pairs or chat), or None."""
    if not isinstance(record, dict):
        return f"a JSON object was expected, got {type(record).__name__}"
    if fmt == "pairs":
        for key in ("prompt", "completion"):
            if not isinstance(record.get(key), str):
                return f"--format pairs needs a string \"{key}\"; the keys here are {sorted(record)}"
        return None
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        return "--format chat needs \"messages\": a list of {\"role\", \"content\"}"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return f"message {i} needs a string \"role\" and a string \"content\""
    if not any(m["role"] == "assistant" for m in messages):
        return "no \"assistant\" message: nothing in this conversation would be learnt"
    return None


def chat_token_ids(tokenizer):
    specials = tokenizer.specials or {}
    if any(t not in specials for t in CHAT_TOKENS):
        raise PrepareError(f"--format chat needs the {', '.join(CHAT_TOKENS)} special tokens of the llama3 "
                           f"tokenizer; the {tokenizer.name} tokenizer has none")
    return [specials[t] for t in CHAT_TOKENS]


def encode_example(tokenizer, record, fmt):
    """(tokens, mask) of one example, starting with BOS; mask[i] is 1 where predicting token i counts for the loss.
    pairs: BOS prompt completion EOS, counted from the completion on (EOS too: the model learns to stop).
    chat: Llama 3's template, BOS then per message <|start_header_id|>role<|end_header_id|> "\n\n" content
    <|eot_id|>, the special tokens as special tokens; the assistant's contents and their <|eot_id|> counted."""
    bos = tokenizer.bos_id
    if fmt == "pairs":
        prompt, completion = encode_text(tokenizer, record["prompt"]), encode_text(tokenizer, record["completion"])
        tokens = [bos] + prompt + completion + [tokenizer.eos_id]
        return tokens, [0] * (1 + len(prompt)) + [1] * (len(completion) + 1)
    start, end, eot = chat_token_ids(tokenizer)
    tokens, mask = [bos], [0]
    for m in record["messages"]:
        head = [start] + encode_text(tokenizer, m["role"]) + [end] + encode_text(tokenizer, "\n\n")
        body = encode_text(tokenizer, m["content"]) + [eot]
        tokens += head + body
        mask += [0] * len(head) + [1 if m["role"] == "assistant" else 0] * len(body)
    return tokens, mask


# ---------------------------------------------------------------- document order

DOC_OVERHEAD = 64  # counted against --buffer-mb for each document: what it costs beyond its text


def _size(data):
    return len(data) if isinstance(data, (str, bytes)) else 0


def _shuffled(block, rng):
    order = list(range(len(block)))
    rng.shuffle(order)
    return [block[i] for i in order]


def shuffled_blocks(source, buffer_bytes, seed):
    """The documents in the order they are written, as events (kind, payload, input bytes read for it):
    ("block", [(item kind, data, origin)...]) for each run of documents read until they hold buffer_bytes, shuffled
    with seed, so that a corpus that fits in one is shuffled whole, as random.Random(seed).shuffle of all its
    documents; a document too long to hold comes in parts ("begin", ..., "end": see Source) where it was read, after
    the block before it."""
    rng = random.Random(seed)
    block, held, read = [], 0, 0
    for kind, data, origin in source.events():
        if kind in ("begin", "part", "end"):
            if block:
                now = source.bytes_read()
                yield "block", _shuffled(block, rng), now - read
                block, held, read = [], 0, now
            now = source.bytes_read()
            yield kind, (data, origin), now - read
            read = now
            continue
        block.append((kind, data, origin))
        held += _size(data) + DOC_OVERHEAD
        if held >= buffer_bytes:
            now = source.bytes_read()
            yield "block", _shuffled(block, rng), now - read
            block, held, read = [], 0, now
    if block:
        yield "block", _shuffled(block, rng), source.bytes_read() - read


def prefetch(items):
    """Iterate items in a thread, one item ahead, so that the next block is read while this one is tokenized; the
    thread waits until each item is taken, so at most two are held. Its exceptions are raised here."""
    handoff = queue.Queue(maxsize=1)

    def produce():
        try:
            for item in items:
                handoff.put((True, item))
                handoff.join()
            handoff.put((False, None))
        except BaseException as e:  # noqa: B036 -- handed to the main thread, which raises it
            handoff.put((False, e))

    threading.Thread(target=produce, name="reader", daemon=True).start()
    while True:
        more, item = handoff.get()
        handoff.task_done()
        if not more:
            if item is not None:
                raise item
            return
        yield item


# ---------------------------------------------------------------- driver

TASK_BYTES = 1 << 20  # text per worker task: big enough to make the hand-off cheap, small enough to share out
# Tasks in flight per worker: a worker a few tasks ahead goes on while the main process reads, splits and writes
# (at 2, the workers of a 2-CPU machine stood idle more often).
TASKS_PER_WORKER = 4
# Tasks sent and not yet written, per worker: the results that come in ahead of a slow task wait for it, and the
# other workers go on meanwhile. Each holds about TASK_BYTES of text and then its tokens (some 1.7 MB in all, measured),
# so with many workers fewer, down to the TASKS_PER_WORKER in flight: at most TASKS_AHEAD_BYTES past those.
TASKS_AHEAD_PER_WORKER = 8
TASKS_AHEAD_BYTES = 256 << 20


def tasks_ahead(workers):
    """How many tasks may be sent and not yet written."""
    extra = min(TASKS_AHEAD_PER_WORKER - TASKS_PER_WORKER, TASKS_AHEAD_BYTES // TASK_BYTES // workers)
    return (TASKS_PER_WORKER + max(0, extra)) * workers


STATE_VERSION = 1


def format_bytes(n):
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def format_seconds(s):
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """Input bytes and tokens done, tokens/s and the time left (from the input's size), on stderr: one line
    rewritten in place on a terminal, else a plain line every 10 seconds and one at the end."""

    def __init__(self, total_bytes):
        self.total = max(total_bytes, 1)
        self.done = self.skipped = 0.0
        self.tokens = 0
        self.start = self.last = time.monotonic()
        self.tty = sys.stderr.isatty()

    def skip(self, nbytes):
        """Input that a resumed run passes over: done by the interrupted run."""
        self.done += nbytes
        self.skipped += nbytes

    def update(self, nbytes, tokens):
        self.done += nbytes
        self.tokens += tokens
        now = time.monotonic()
        if now - self.last >= (0.5 if self.tty else 10.0):
            self.last = now
            self._show(now)

    def _show(self, now, final=False):
        elapsed = max(now - self.start, 1e-9)
        rate = (self.done - self.skipped) / elapsed
        left = format_seconds((self.total - self.done) / rate) if rate > 0 else "?"
        line = (f"prepare: {min(100.0, 100 * self.done / self.total):5.1f}% of {format_bytes(self.total)}, "
                f"{self.tokens:,} tokens, {self.tokens / elapsed:,.0f} tokens/s, "
                + (f"{format_seconds(elapsed)} in all" if final else f"{left} left"))
        if self.tty:
            print("\r" + line + "\033[K", end="\n" if final else "", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self):
        self._show(time.monotonic(), final=True)

    def break_line(self):
        """End the line being rewritten, before a message."""
        if self.tty:
            print(file=sys.stderr)


def state_path(out_dir, name):
    return os.path.join(out_dir, f"{name}_prepare_state.json")


class Run:
    """One run of prepare: the documents of source in shuffled_blocks' order, tokenized by a pool of workers,
    each given whole to val (the first ones, until val holds val_tokens tokens) or to train, written into shards as
    they fill. After each complete shard, the state file records where the stream stands, for --resume."""

    def __init__(self, args, tokenizer, source):
        self.args, self.tokenizer, self.source = args, tokenizer, source
        self.out_dir, self.name = args.out_dir, args.name
        self.masked = args.format != "text"
        self.typecode = "H" if bytes_per_token(tokenizer.vocab_size) == 2 else "I"
        self.itemsize = array(self.typecode).itemsize
        assert self.itemsize == bytes_per_token(tokenizer.vocab_size)  # array sizes vary by platform
        self.buffer_bytes = int(args.buffer_mb * 2**20)
        # what decides the output, which a resumed run must share (--workers does not)
        self.options = {"tokenizer": tokenizer.name, "format": args.format, "text_field": args.text_field,
                        "doc_separator": args.doc_separator, "seed": args.seed, "val_tokens": args.val_tokens,
                        "shard_tokens": args.shard_tokens, "buffer_mb": args.buffer_mb}
        self.inputs = source.identity()
        self.writers = {split: SplitWriter(self.out_dir, self.name, split, args.shard_tokens, tokenizer,
                                           self.itemsize, self.masked) for split in ("val", "train")}
        self.stats = InputStats(source, args.strict)
        # Where the stream stands: the item (document, or record that may be one) last taken, in the order written;
        # the document being written: its item, where it began in the tokens (val's, then train's), its split, and
        # the input problems before it; the tokens so far; per split, the documents begun and the tokens written.
        self.item, self.doc, self.doc_start, self.split = -1, -1, 0, None
        self.doc_stats, self.doc_stats_changes = self.stats.state(), 0
        self.offset = 0
        self.counts = {"val": [0, 0], "train": [0, 0]}
        self.counted = 0  # tokens written with mask 1
        # resumed: the items the interrupted run wrote, and the tokens it wrote of the document after them
        self.skip_items, self.drop, self.resumed_split = 0, 0, None
        self.removed = 0
        self.resumed = False
        self.part_bytes = 0.0
        # PREPARE_TEST_KILL=N[:SIGNAL]: the tests' way to interrupt a run at a known point, with shard N + 1 half
        # written (SIGKILL by default)
        kill = os.environ.get("PREPARE_TEST_KILL")
        self.kill = None
        if kill:
            shards, _, name = kill.partition(":")
            self.kill = (int(shards), signal.Signals["SIG" + (name or "KILL")])

    def complete_shards(self):
        return sum(len(w.written) for w in self.writers.values())

    # ------------------------------------------------------------ state

    def save_state(self):
        state = {"version": STATE_VERSION, "options": self.options, "inputs": self.inputs,
                 "item": self.doc, "into_doc": self.offset - self.doc_start, "split": self.split,
                 "offset": self.offset, "counts": self.counts, "counted": self.counted, "stats": self.doc_stats,
                 "shards": {split: [[os.path.basename(path), count] for path, count in w.written]
                            for split, w in self.writers.items()}}
        path = state_path(self.out_dir, self.name)
        with open(path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(path + ".tmp", path)

    def resume(self):
        """Take up the interrupted run recorded in the state file, or say why not."""
        path = state_path(self.out_dir, self.name)
        try:
            with open(path) as f:
                state = json.load(f)
        except FileNotFoundError:
            raise PrepareError(f"nothing to resume: there is no {path}\n  (a run writes it as it goes and removes "
                               f"it when it finishes)\n  fix: run without --resume") from None
        except (OSError, ValueError) as e:
            raise PrepareError(f"cannot resume: {path} is unreadable ({e})\n  fix: run without --resume") from None
        if state.get("version") != STATE_VERSION:
            raise PrepareError(f"cannot resume: {path} is of another version of prepare.py\n"
                               f"  fix: run without --resume")
        changed = [f"--{key.replace('_', '-')} was {state['options'].get(key)!r}, now {value!r}"
                   for key, value in self.options.items() if state["options"].get(key) != value]
        if changed:
            raise PrepareError("cannot resume: the options differ from the interrupted run's:\n  "
                               + "\n  ".join(changed) + "\n  fix: give the same options, or run without --resume")
        if state["inputs"] != self.inputs:
            before = {entry[0]: entry[1:] for entry in state["inputs"]}
            now = {entry[0]: entry[1:] for entry in self.inputs}
            what = ([f"{p}: new" for p in now if p not in before] + [f"{p}: gone" for p in before if p not in now]
                    + [f"{p}: changed (size or time)" for p in now if p in before and now[p] != before[p]])
            raise PrepareError("cannot resume: the inputs changed since the interrupted run:\n  "
                               + "\n  ".join(what[:10]) + ("\n  ..." if len(what) > 10 else "")
                               + "\n  fix: run without --resume")
        each = self.itemsize + self.masked
        for split, shards in state["shards"].items():
            for name, count in shards:
                shard = os.path.join(self.out_dir, name)
                if not os.path.isfile(shard) or os.path.getsize(shard) != HEADER_BYTES + count * each:
                    raise PrepareError(f"cannot resume: {shard}, which the interrupted run completed, is missing "
                                       f"or changed\n  fix: run without --resume")
            self.writers[split].written = [(os.path.join(self.out_dir, name), count) for name, count in shards]
        if state["item"] >= 0:
            self.skip_items, self.drop, self.resumed_split = state["item"], state["into_doc"], state["split"]
            self.item, self.offset = state["item"] - 1, state["offset"] - state["into_doc"]
        self.counts, self.counted = state["counts"], state["counted"]
        self.stats.restore(state["stats"])
        self.doc_stats = state["stats"]
        self.resumed = True

    def remove_output(self):
        """After an error in the inputs: no shard of this run is left for a glob to pick up."""
        for writer in self.writers.values():
            writer.written = []
        remove_shards(self.out_dir, self.name)
        with contextlib.suppress(FileNotFoundError):
            os.remove(state_path(self.out_dir, self.name))

    # ------------------------------------------------------------ running

    def prepare(self):
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            if self.args.resume:
                self.resume()
                remove_shards(self.out_dir, self.name, keep={p for w in self.writers.values() for p, _ in w.written})
            else:
                self.removed = remove_shards(self.out_dir, self.name)
            self.save_state()
        except OSError as e:
            raise PrepareError(f"cannot write to {self.out_dir}: {e.strerror}") from None
        self.progress = Progress(self.source.total_bytes)
        start = time.monotonic()
        tokens_before = self.offset + self.drop
        # the workers are forked before the reader thread starts: forking a process that has threads is unsafe
        pool = WorkerPool(self.args.workers, TaskEncoder(self.tokenizer, self.args.format, self.typecode,
                                                         self.args.text_field))
        try:
            self._stream(pool)
            self._finish()
        except BaseException as e:
            for writer in self.writers.values():
                writer.abort()
            self.progress.break_line()
            if isinstance(e, PrepareError) and not isinstance(e, ResumableError):
                self.remove_output()
            if isinstance(e, OSError):
                raise ResumableError(f"cannot write to {self.out_dir}: {e}") from None
            raise
        finally:
            pool.close()
        self.progress.close()
        return {"seconds": time.monotonic() - start, "tokens": self.offset - tokens_before}

    def _stream(self, pool):
        blocks = prefetch(shuffled_blocks(self.source, self.buffer_bytes, self.args.seed))
        window, ahead = collections.deque(), tasks_ahead(self.args.workers)  # tasks sent and not yet written, in order
        for kinds, items, origins, nbytes in self._tasks(self._pieces(blocks)):
            pool.send((kinds, items))
            window.append((kinds, origins, nbytes))
            if len(window) >= ahead:
                self._take(*window.popleft(), pool.receive())
        while window:
            self._take(*window.popleft(), pool.receive())

    def _pieces(self, events):
        """The items to tokenize, in order, each (kind, data, origin, input bytes it stands for): documents, and
        long ones in pieces, cut where tiktoken needs them cut anyway, to spread them over the workers. Leaves out
        the items that the interrupted run of a resumed one wrote."""
        item = -1
        events = iter(events)
        for event, payload, nbytes in events:
            if event == "block":
                per_byte = nbytes / max(1, sum(_size(data) for _, data, _ in payload))
                for i, (kind, data, origin) in enumerate(payload):
                    payload[i] = None  # handed on: the block's memory goes as it is tokenized
                    item += 1
                    if item < self.skip_items:
                        self.progress.skip(_size(data) * per_byte)
                    elif kind in (ITEM_BYTES, ITEM_TEXT) and len(data) > TASK_BYTES:
                        text = data if kind == ITEM_TEXT else data.decode("utf-8", "surrogateescape")
                        for j, piece in enumerate(cut_pieces((text,))):
                            yield (ITEM_PIECE if j else ITEM_TEXT), piece, origin, len(piece) * per_byte
                    else:
                        yield kind, data, origin, _size(data) * per_byte
            else:  # "begin": a document too long to hold, whose parts follow
                item += 1
                data, origin = payload
                parts = self._parts(data, nbytes, events)
                if item < self.skip_items:
                    collections.deque(parts, maxlen=0)
                    self.progress.skip(self.part_bytes)
                    self.part_bytes = 0.0
                    continue
                for j, piece in enumerate(cut_pieces(parts)):
                    yield (ITEM_PIECE if j else ITEM_TEXT), piece, origin, self.part_bytes
                    self.part_bytes = 0.0

    def _parts(self, data, nbytes, events):
        """The text of a document too long to hold: its "begin" event's bytes, then its parts' up to its "end"
        event, decoded (invalid UTF-8 kept as surrogates, as for ITEM_TEXT)."""
        decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self.part_bytes += nbytes
        yield decoder.decode(data)
        for event, (data, _), nbytes in events:
            self.part_bytes += nbytes
            yield decoder.decode(data, final=event == "end")
            if event == "end":
                return

    def _tasks(self, pieces):
        """Worker tasks of about TASK_BYTES: (kinds, items, their origins, input bytes)."""
        kinds, items, origins, size, nbytes = bytearray(), [], [], 0, 0.0
        for kind, data, origin, share in pieces:
            kinds.append(kind)
            items.append(data)
            origins.append(origin)
            size += _size(data) + DOC_OVERHEAD
            nbytes += share
            if size >= TASK_BYTES:
                yield bytes(kinds), items, origins, nbytes
                kinds, items, origins, size, nbytes = bytearray(), [], [], 0, 0.0
        if items:
            yield bytes(kinds), items, origins, nbytes

    def _take(self, kinds, origins, nbytes, result):
        """Write a task's tokens, in the order of the documents, and count its input problems."""
        data, offsets, mask, events = result
        data = memoryview(data)
        events = collections.deque(events)
        for i, kind in enumerate(kinds):
            if kind != ITEM_PIECE:
                self.item += 1
                if offsets[i + 1] > offsets[i]:  # else no document: only whitespace, or a record skipped
                    self._begin_document()
            while events and events[0][0] == i:
                self.stats.add(events.popleft()[1:], origins[i])
            self._write(data, mask, offsets[i], offsets[i + 1])
        self.progress.update(nbytes, offsets[-1])

    def _begin_document(self):
        self.doc, self.doc_start = self.item, self.offset
        if self.stats.changes != self.doc_stats_changes:  # the input problems before it, for the state file
            self.doc_stats, self.doc_stats_changes = self.stats.state(), self.stats.changes
        if self.resumed_split:  # the document the interrupted run was writing: counted, and its split chosen
            self.split, self.resumed_split = self.resumed_split, None
            return
        split = "val" if self.counts["val"][1] < self.args.val_tokens else "train"
        self.counts[split][0] += 1
        if split != self.split:
            self.split = split
            if split == "train" and self.writers["val"].close():
                self.save_state()

    def _write(self, data, mask, a, b):
        """Tokens a..b of a task's result to the current document's split, completing shards as they fill."""
        if self.drop:  # the beginning of the document that a resumed run continues: written already
            n = min(self.drop, b - a)
            a, self.offset, self.drop = a + n, self.offset + n, self.drop - n
        writer = self.writers[self.split] if a < b else None
        while a < b:
            n = min(b - a, writer.room())
            writer.write(data[a * self.itemsize:(a + n) * self.itemsize], None if mask is None else mask[a:a + n])
            self.counts[self.split][1] += n
            if mask is not None:
                self.counted += mask.count(1, a, a + n)
            a, self.offset = a + n, self.offset + n
            if writer.room() == 0:
                writer.close()
                self.save_state()
            if self.kill and writer.shard and self.complete_shards() >= self.kill[0]:
                os.kill(os.getpid(), self.kill[1])

    def _finish(self):
        if self.doc < 0:
            raise PrepareError("the inputs hold no text (every document is empty)"
                               + "".join(f"\n  {line}" for line in self.stats.lines()))
        if self.counts["train"][0] == 0:
            raise PrepareError(
                f"all {self.counts['val'][0]:,} documents ({self.counts['val'][1]:,} tokens) went to val, none to "
                f"train\n  fix: lower --val-tokens (now {self.args.val_tokens:,}) or add text")
        for writer in self.writers.values():
            writer.close()
        self.removed += remove_shards(self.out_dir, self.name,
                                      keep={path for w in self.writers.values() for path, _ in w.written})
        copy_tokenizer(self.tokenizer, self.out_dir, self.name)
        os.remove(state_path(self.out_dir, self.name))


def tokenizer_copy_path(out_dir, name):
    return os.path.join(out_dir, f"{name}_tokenizer.model")


def copy_tokenizer(tokenizer, out_dir, name):
    """The tokenizer file beside the shards as NAME_tokenizer.model, where the trainers look for it
    (samples, exports); written to a temporary name and renamed, like the shards."""
    if not tokenizer.path:
        return
    dest = tokenizer_copy_path(out_dir, name)
    tmp = dest + ".tmp"
    shutil.copyfile(tokenizer.path, tmp)
    os.replace(tmp, dest)


def default_workers():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Tokenize text into token shards for llmc/dataloader.h (docs/shard_format.md).")
    p.add_argument("inputs", nargs="*",
                   help="files and folders (searched recursively): text, JSON lines (.jsonl, .json) and parquet, "
                        "text and JSON lines also .gz or .zst compressed; none: the default corpus (KJV Bible from "
                        "bible-kjv, one document per book, plus fortunes, one per fortune)")
    p.add_argument("--out-dir", default=DEFAULT_OUT_DIR, help="where shards go (default: %(default)s)")
    p.add_argument("--name", default="corpus", help="shard name prefix: <name>_train_000000.bin (default: %(default)s)")
    p.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard (default: %(default)s)")
    p.add_argument("--val-tokens", type=int, default=100_000,
                   help="whole documents, the first in the shuffled order, go to val until it holds this many "
                        "tokens; 0: no val split (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1337, help="seed of the document shuffle (default: %(default)s)")
    p.add_argument("--tokenizer", choices=sorted(TOKENIZERS), default="llama3",
                   help="llama3 (needs llama-models) or gpt2 (needs openai-whisper) (default: %(default)s)")
    p.add_argument("--tokenizer-model", metavar="PATH",
                   help="the tokenizer file; default: the one in the --tokenizer's PyPI package")
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
                   help="tokenizer processes; the shards are the same for any number (default: the CPUs, "
                        "%(default)s)")
    p.add_argument("--buffer-mb", type=float, default=256,
                   help="MiB of text held at once: the documents are shuffled in blocks of this much, so a corpus "
                        "that fits in one is shuffled whole; a document over a quarter of it is not held but "
                        "streamed, unshuffled. Memory is about twice this (default: %(default)s)")
    p.add_argument("--strict", action="store_true",
                   help="stop at invalid UTF-8 or a bad JSON record, instead of replacing or skipping it")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run of the same options and inputs from its last complete shard "
                        "(the state in <out-dir>/<name>_prepare_state.json); the shards come out the same")
    p.add_argument("--check", nargs="+", metavar="SHARD", help="only validate and print the headers of these shards")
    args = p.parse_args(argv)
    if args.shard_tokens < 1:
        p.error("--shard-tokens must be at least 1")
    if args.val_tokens < 0:
        p.error("--val-tokens must be 0 or more")
    if args.workers < 1:
        p.error("--workers must be at least 1")
    if not args.buffer_mb > 0:
        p.error("--buffer-mb must be more than 0")
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
    signal.signal(signal.SIGTERM, _raise_interrupted)
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


if __name__ == "__main__":
    sys.exit(main())
