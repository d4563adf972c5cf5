"""The inputs: the files named or found in folders (find_input_files, check_input_files), by their names text, JSON
lines or parquet, compressed or not (compressed.py), read in order as a stream of documents or of records that may be
one, with where each came from (Source); a text file split into documents as it streams in (DocumentSplitter).
Reads the input files; writes nothing. What a document is made of, decoding and parsing, is the workers' work
(tasks.py).
"""

import codecs
import json
import os
import re

from .compressed import COMPRESSIONS, READ_BYTES, opened_input, read_errors
from .errors import PrepareError, require_module
from .progress import format_bytes


# The kinds of item a Source gives, each sent with a worker task as a byte (tasks.py). Documents of text files go as
# their raw bytes, JSON lines as theirs: decoding, parsing and checking them is the workers' work, which keeps the main
# process light.
ITEM_PIECE = 0  # str: the next piece of the document begun before (decoded with surrogateescape, as ITEM_TEXT)
ITEM_TEXT = 1   # str: a document, or the first piece of a long one; from a file, decoded with surrogateescape
ITEM_BYTES = 2  # bytes: a document of a text file, UTF-8
ITEM_JSON = 3   # bytes or str: a JSON line (or a parquet row as JSON): a --text-field document, or an example
ITEM_VALUE = 4  # the --text-field value of a parquet row: a document if it is a string (or UTF-8 bytes)

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
