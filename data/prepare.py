#!/usr/bin/env python3
"""Tokenize text into the token shards that llmc/dataloader.h reads.

    python3 data/prepare.py                       # default corpus: KJV Bible + fortunes
    python3 data/prepare.py my_texts/ notes.txt   # your own files and folders
    python3 data/prepare.py --check data/shards/corpus_val_000000.bin

The shard format and every option are described in docs/shard_format.md.
Needs `pip install tiktoken` and `pip install --no-deps llama-models` (the Llama 3
tokenizer file); the default corpus needs `apt-get install bible-kjv fortunes`.
"""

import argparse
import base64
import codecs
import hashlib
import importlib.util
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import time
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


def _split_long_runs(text):
    if not _LONG_RUN.search(text):
        return [text]
    pieces, start = [], 0
    for run in _LONG_RUN.finditer(text):
        for cut in range(run.start() + MAX_NO_WHITESPACES_CHARS, run.end(), MAX_NO_WHITESPACES_CHARS):
            pieces.append(text[start:cut])
            start = cut
    pieces.append(text[start:])
    return pieces


def encodable_pieces(text):
    """Split text into pieces tiktoken can encode, cutting where the token stream is least affected."""
    pieces, start = [], 0
    while len(text) - start > TIKTOKEN_MAX_ENCODE_CHARS:
        end = start + TIKTOKEN_MAX_ENCODE_CHARS
        cut = text.rfind("\n", start, end) + 1  # after a newline: a pre-token boundary
        if cut <= start:
            cut = text.rfind(" ", start + 1, end)  # before a space, which belongs to the next word
        if cut <= start:
            cut = end
        pieces.extend(_split_long_runs(text[start:cut]))
        start = cut
    pieces.extend(_split_long_runs(text[start:]))
    return pieces


def encode_documents(tokenizer, docs):
    """Token lists, each starting with BOS, for a batch of documents (threads across the pieces)."""
    pieces, owners = [], []
    for i, doc in enumerate(docs):
        for piece in encodable_pieces(doc):
            pieces.append(piece)
            owners.append(i)
    encoded = tokenizer.encoding.encode_ordinary_batch(pieces, num_threads=os.cpu_count() or 1)
    out = [[tokenizer.bos_id] for _ in docs]
    for owner, tokens in zip(owners, encoded):
        out[owner].extend(tokens)
    return out


# ---------------------------------------------------------------- documents

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


def _looks_like_text(path):
    with open(path, "rb") as f:
        head = f.read(8192)
    if b"\0" in head:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return True


def find_input_files(paths):
    """Named files as given, plus the text files under named folders (sorted, hidden ones skipped)."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(names):
                    full = os.path.join(root, name)
                    if not name.startswith(".") and os.path.isfile(full) and _looks_like_text(full):
                        files.append(full)
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise PrepareError(f"input path not found: {path}\n  fix: pass existing text files or folders")
    if not files:
        raise PrepareError(f"no text files found in: {' '.join(paths)}")
    return files


def read_documents(files, separator):
    docs = []
    for path in files:
        try:
            with open(path, encoding="utf-8", newline="") as f:  # keep "\r\n": documents are the exact text
                text = f.read()
        except UnicodeDecodeError as e:
            raise PrepareError(f"{path} is not UTF-8 text ({e})\n"
                               f"  fix: convert it (iconv -t utf-8) or leave it out") from None
        docs.extend(split_documents(text, separator))
    return docs


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


def write_shard(path, tokens, tokenizer, mask=None):
    """Write header + tokens (+ the loss mask, one byte per token: version 2) to path.tmp, then rename, so a
    reader never sees a half-written shard."""
    if mask is not None and len(mask) != len(tokens):
        raise ValueError(f"{len(mask)} mask bytes for {len(tokens)} tokens")
    if sys.byteorder != "little":
        tokens = array(tokens.typecode, tokens)
        tokens.byteswap()
    header = HEADER_STRUCT.pack(MAGIC, VERSION if mask is None else VERSION_MASKED, tokens.itemsize,
                                tokenizer.vocab_size, len(tokens), tokenizer.bos_id, tokenizer.eos_id)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(header.ljust(HEADER_BYTES, b"\0"))
            tokens.tofile(f)
            if mask is not None:
                f.write(bytes(mask))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


class ShardWriter:
    """Cuts one split's token stream (and, when masked, its loss mask) into shards of exactly shard_tokens tokens
    (the last one shorter)."""

    def __init__(self, out_dir, name, split, shard_tokens, tokenizer, masked=False):
        self.out_dir, self.name, self.split = out_dir, name, split
        self.shard_tokens, self.tokenizer = shard_tokens, tokenizer
        self.typecode = "H" if bytes_per_token(tokenizer.vocab_size) == 2 else "I"
        assert array(self.typecode).itemsize == bytes_per_token(tokenizer.vocab_size)  # array sizes vary by platform
        self.buffer = array(self.typecode)
        self.mask = bytearray() if masked else None
        self.written = []  # (path, token count)

    def add(self, tokens, mask=None):
        if (mask is None) != (self.mask is None):
            raise ValueError("a masked writer takes a mask with every example, an unmasked one none")
        pos = 0
        while pos < len(tokens):
            room = self.shard_tokens - len(self.buffer)
            self.buffer.extend(tokens[pos:pos + room])
            if mask is not None:
                self.mask.extend(mask[pos:pos + room])
            pos += room
            if len(self.buffer) == self.shard_tokens:
                self.flush()

    def flush(self):
        if self.buffer:
            path = shard_path(self.out_dir, self.name, self.split, len(self.written))
            write_shard(path, self.buffer, self.tokenizer, self.mask)
            self.written.append((path, len(self.buffer)))
            self.buffer = array(self.typecode)
            self.mask = bytearray() if self.mask is not None else None


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


def check_example(record, fmt, where):
    """PrepareError naming where (file:line) unless record is a fine-tuning example of fmt."""
    if not isinstance(record, dict):
        raise PrepareError(f"{where}: a JSON object was expected, got {type(record).__name__}")
    if fmt == "pairs":
        for key in ("prompt", "completion"):
            if not isinstance(record.get(key), str):
                raise PrepareError(f"{where}: --format pairs needs a string \"{key}\"; the keys here are "
                                   f"{sorted(record)}")
        return
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise PrepareError(f"{where}: --format chat needs \"messages\": a list of {{\"role\", \"content\"}}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise PrepareError(f"{where}: message {i} needs a string \"role\" and a string \"content\"")
    if not any(m["role"] == "assistant" for m in messages):
        raise PrepareError(f"{where}: no \"assistant\" message: nothing in this conversation would be learnt")


def read_examples(files, fmt):
    """The fine-tuning examples of JSON lines files, each (where, record), checked as they are read."""
    examples = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    where = f"{path}:{lineno}"
                    try:
                        record = json.loads(line)
                    except ValueError as e:
                        raise PrepareError(f"{where}: not JSON: {e}") from None
                    check_example(record, fmt, where)
                    examples.append((where, record))
        except UnicodeDecodeError as e:
            raise PrepareError(f"{path}: not UTF-8 ({e})") from None
        except OSError as e:
            raise PrepareError(f"cannot read {path}: {e.strerror}") from None
    return examples


def example_chars(record):
    """The characters of an example's texts (its prompt and completion, or its messages' contents)."""
    if "messages" in record:
        return sum(len(m["content"]) for m in record["messages"])
    return len(record["prompt"]) + len(record["completion"])


def encode_text(tokenizer, text):
    tokens = []
    for piece in tokenizer.encoding.encode_ordinary_batch(encodable_pieces(text)):
        tokens.extend(piece)
    return tokens


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
    specials = tokenizer.specials or {}
    if any(t not in specials for t in CHAT_TOKENS):
        raise PrepareError(f"--format chat needs the {', '.join(CHAT_TOKENS)} special tokens of the llama3 "
                           f"tokenizer; the {tokenizer.name} tokenizer has none")
    start, end, eot = (specials[t] for t in CHAT_TOKENS)
    tokens, mask = [bos], [0]
    for m in record["messages"]:
        head = [start] + encode_text(tokenizer, m["role"]) + [end] + encode_text(tokenizer, "\n\n")
        body = encode_text(tokenizer, m["content"]) + [eot]
        tokens += head + body
        mask += [0] * len(head) + [1 if m["role"] == "assistant" else 0] * len(body)
    return tokens, mask


# ---------------------------------------------------------------- driver

class Progress:
    """tqdm when installed, else a one-line counter on stderr."""

    def __init__(self, total_docs):
        self.total, self.docs, self.tokens, self.last = total_docs, 0, 0, 0.0
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total_docs, unit="doc", file=sys.stderr)
        except ImportError:
            self.bar = None
        self.tty = sys.stderr.isatty()

    def update(self, docs, tokens):
        self.docs += docs
        self.tokens += tokens
        if self.bar is not None:
            self.bar.update(docs)
            self.bar.set_postfix(tokens=f"{self.tokens:,}", refresh=False)
            return
        now = time.monotonic()
        if now - self.last >= (0.2 if self.tty else 10.0) or self.docs == self.total:
            self.last = now
            start = "\r" if self.tty else ""
            end = "" if self.tty and self.docs < self.total else "\n"
            print(f"{start}tokenizing: {self.docs:,}/{self.total:,} documents, {self.tokens:,} tokens",
                  end=end, file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def remove_stale_shards(out_dir, name, keep):
    """Drop shards of this name left by an earlier, longer run, which a glob would otherwise pick up."""
    pattern = re.compile(re.escape(name) + r"_(train|val)_\d{6}\.bin")
    removed = 0
    for entry in os.listdir(out_dir):
        path = os.path.join(out_dir, entry)
        if pattern.fullmatch(entry) and path not in keep:
            os.remove(path)
            removed += 1
    return removed


def prepare(docs, tokenizer, out_dir, name, shard_tokens, val_tokens, seed, batch_chars=1 << 20, fmt="text"):
    """Shuffle documents (or fine-tuning examples, fmt pairs or chat: (where, record)) with seed; the first ones go
    to val until it holds val_tokens, the rest to train. Examples write masked shards (version 2)."""
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    os.makedirs(out_dir, exist_ok=True)
    masked = fmt != "text"
    writers = {split: ShardWriter(out_dir, name, split, shard_tokens, tokenizer, masked) for split in ("val", "train")}
    counts = {"val": [0, 0], "train": [0, 0]}  # documents, tokens
    counted_tokens = 0
    progress = Progress(len(docs))
    start = time.monotonic()
    pos = 0
    while pos < len(order):
        batch, chars = [], 0
        while pos < len(order) and (not batch or chars < batch_chars):
            batch.append(docs[order[pos]])
            chars += example_chars(batch[-1][1]) if masked else len(batch[-1])
            pos += 1
        if masked:
            encoded = [encode_example(tokenizer, record, fmt) for _, record in batch]
        else:
            encoded = [(tokens, None) for tokens in encode_documents(tokenizer, batch)]
        batch_tokens = 0
        for tokens, mask in encoded:
            split = "val" if counts["val"][1] < val_tokens else "train"
            writers[split].add(tokens, mask)
            counts[split][0] += 1
            counts[split][1] += len(tokens)
            batch_tokens += len(tokens)
            counted_tokens += sum(mask) if mask is not None else len(tokens)
        progress.update(len(batch), batch_tokens)
    progress.close()
    elapsed = time.monotonic() - start
    if counts["train"][0] == 0:
        raise PrepareError(
            f"all {len(docs)} documents ({counts['val'][1]:,} tokens) went to val, none to train\n"
            f"  fix: lower --val-tokens (now {val_tokens:,}) or add text")
    for writer in writers.values():
        writer.flush()
    written = writers["train"].written + writers["val"].written
    removed = remove_stale_shards(out_dir, name, {path for path, _ in written})
    copy_tokenizer(tokenizer, out_dir, name)
    return {"counts": counts, "written": written, "removed": removed, "seconds": elapsed, "counted": counted_tokens}


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


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Tokenize text files into token shards for llmc/dataloader.h (docs/shard_format.md).")
    p.add_argument("inputs", nargs="*",
                   help="text files and folders (searched recursively); none: the default corpus "
                        "(KJV Bible from bible-kjv, one document per book, plus fortunes, one per fortune)")
    p.add_argument("--out-dir", default=DEFAULT_OUT_DIR, help="where shards go (default: %(default)s)")
    p.add_argument("--name", default="corpus", help="shard name prefix: <name>_train_000000.bin (default: %(default)s)")
    p.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard (default: %(default)s)")
    p.add_argument("--val-tokens", type=int, default=100_000,
                   help="whole documents, picked at random with --seed, go to val until it holds this many "
                        "tokens; 0: no val split (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1337, help="seed of the document shuffle (default: %(default)s)")
    p.add_argument("--tokenizer", choices=sorted(TOKENIZERS), default="llama3",
                   help="llama3 (needs llama-models) or gpt2 (needs openai-whisper) (default: %(default)s)")
    p.add_argument("--tokenizer-model", metavar="PATH",
                   help="the tokenizer file; default: the one in the --tokenizer's PyPI package")
    p.add_argument("--doc-separator", default="file",
                   help="how files split into documents: file (one per file), blank (blank lines), "
                        "line (one per line), or regex:PATTERN (re.split, multiline) (default: %(default)s)")
    p.add_argument("--format", choices=("text", "pairs", "chat"), default="text",
                   help="text: documents of text files; pairs: JSON lines {\"prompt\", \"completion\"}; chat: JSON "
                        "lines {\"messages\": [{\"role\", \"content\"}]} (Llama 3 chat template). pairs and chat "
                        "write shards with a loss mask: only completions, and the assistant's turns, count "
                        "(default: %(default)s)")
    p.add_argument("--check", nargs="+", metavar="SHARD", help="only validate and print the headers of these shards")
    args = p.parse_args(argv)
    if args.shard_tokens < 1:
        p.error("--shard-tokens must be at least 1")
    if args.val_tokens < 0:
        p.error("--val-tokens must be 0 or more")
    if args.doc_separator not in ("file", "blank", "line") and not args.doc_separator.startswith("regex:"):
        p.error("--doc-separator must be file, blank, line or regex:PATTERN")
    if args.doc_separator.startswith("regex:"):
        try:
            re.compile(args.doc_separator[len("regex:"):])
        except re.error as e:
            p.error(f"bad --doc-separator regex: {e}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.check:
        return check_shards(args.check)
    try:
        if args.format != "text":
            if not args.inputs:
                raise PrepareError(f"--format {args.format} needs JSON lines files or folders of them as inputs")
            docs = read_examples(find_input_files(args.inputs), args.format)
        elif args.inputs:
            docs = read_documents(find_input_files(args.inputs), args.doc_separator)
        else:
            docs = default_corpus_documents()
        if not docs:
            raise PrepareError("the inputs hold no text (every document is empty)")
        tokenizer = load_tokenizer(args.tokenizer, args.tokenizer_model)
        result = prepare(docs, tokenizer, args.out_dir, args.name, args.shard_tokens, args.val_tokens, args.seed,
                         fmt=args.format)
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    (val_docs, val_tok), (train_docs, train_tok) = result["counts"]["val"], result["counts"]["train"]
    total = val_tok + train_tok
    print(f"tokenizer: {tokenizer.name}, vocab_size {tokenizer.vocab_size}, "
          f"uint{8 * bytes_per_token(tokenizer.vocab_size)} tokens")
    print(f"documents: {val_docs + train_docs:,} ({train_docs:,} train, {val_docs:,} val)")
    print(f"tokens:    {total:,} ({train_tok:,} train, {val_tok:,} val)"
          + (f"; the loss counts {result['counted']:,} of them (loss mask)" if args.format != "text" else ""))
    print(f"shards:    {len(result['written'])} written to {args.out_dir}")
    for path, count in result["written"]:
        print(f"  {path}  {count:,} tokens")
    if result["removed"]:
        print(f"removed {result['removed']} stale shard(s) named {args.name} from an earlier run")
    print(f"speed:     {total / max(result['seconds'], 1e-9):,.0f} tokens/s ({result['seconds']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
