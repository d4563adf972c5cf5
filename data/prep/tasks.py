"""Worker tasks: what a tokenizer worker makes of a task's items (TaskEncoder: decodes, parses and checks them, and
tokenizes the documents and examples), and the input problems it finds on the way, tallied in the main process
(InputStats: invalid UTF-8 and lone surrogates replaced, records skipped; with --strict the first is an error).
Reads and writes nothing.
"""

import codecs
import json
import re
import sys
from array import array

from .errors import PrepareError, require_module
from .examples import encode_example, example_problem
from .readers import ITEM_BYTES, ITEM_JSON, ITEM_PIECE, ITEM_TEXT, ITEM_VALUE
from .tokenizers import encodable_pieces


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

# A JSON string may hold a lone surrogate, "\ud800": json.loads gives it as is (a pair of escapes is one character),
# but it is no character, and UTF-8, so tiktoken, cannot encode it. Only a line with such an escape can hold one:
# the others are not searched.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def may_hold_surrogates(line):
    """Whether a JSON line (bytes or str) has an escape that may give a lone surrogate."""
    pattern = _SURROGATE_ESCAPE_BYTES if isinstance(line, bytes) else _SURROGATE_ESCAPE
    return pattern.search(line) is not None


def replace_surrogates(value, found):
    """value (parsed JSON) with every lone surrogate in its strings and keys replaced with U+FFFD; found, a list
    [count, first], takes their number and the first one (as "\\udXXX")."""
    if isinstance(value, str):
        first = _SURROGATE.search(value)
        if first is None:
            return value
        if not found[0]:
            found[1] = f"\\u{ord(first.group()):04x}"
        fixed, count = _SURROGATE.subn("\ufffd", value)
        found[0] += count
        return fixed
    if isinstance(value, list):
        return [replace_surrogates(v, found) for v in value]
    if isinstance(value, dict):
        return {replace_surrogates(k, found): replace_surrogates(v, found) for k, v in value.items()}
    return value


class TaskEncoder:
    """Tokenizes tasks in a worker process. A task is (kinds, items): see ITEM_*. The result is the tokens (bytes,
    little-endian), where each item's tokens begin (and their total), the loss mask of examples (bytes), and events:
    (item, "replaced", count, (reason, offset)) for invalid UTF-8, (item, "surrogates", count, first) for lone
    surrogates in a JSON line's strings (replaced with U+FFFD), (item, "skipped", why, what) for a record that is
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
            if may_hold_surrogates(item):
                found = [0, None]
                record = replace_surrogates(record, found)
                if found[0]:
                    events.append((i, "surrogates", found[0], found[1]))
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


class InputStats:
    """Input problems that need not stop a run, as the workers find them: invalid UTF-8 (replaced with U+FFFD) and
    records skipped, counted for the summary with the first place (in input order) of each. With strict, the first
    one found is an error."""

    def __init__(self, source, strict):
        self.source, self.strict = source, strict
        self.replaced = [0, None]  # byte sequences, the origin of the first document with any
        self.surrogates = [0, None]  # lone surrogates in JSON strings, the origin of the first record with any
        self.skipped = {}  # why -> [records, the origin of the first, what is wrong with it]
        self.changes = 0

    def add(self, event, origin):
        self.changes += 1
        if event[0] == "surrogates":
            _, count, first = event
            if self.strict:
                raise PrepareError(f"{self.source.where(origin)}: a lone surrogate ({first}) in a JSON string: no "
                                   f"character, and not encodable in UTF-8\n  fix: mend that record (a character "
                                   f"past U+FFFF is a pair of escapes, \\ud800-\\udbff then \\udc00-\\udfff), or drop "
                                   f"--strict to replace lone surrogates with U+FFFD")
            self.surrogates[0] += count
            if self.surrogates[1] is None or origin < tuple(self.surrogates[1]):
                self.surrogates[1] = origin
            return
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
        return json.loads(json.dumps({"replaced": self.replaced, "surrogates": self.surrogates,
                                      "skipped": self.skipped}))

    def restore(self, state):
        self.replaced = state["replaced"]
        self.surrogates = state.get("surrogates", [0, None])  # absent from the states of earlier versions
        self.skipped = state["skipped"]

    def lines(self):
        lines = []
        if self.replaced[0]:
            lines.append(f"invalid UTF-8: {self.replaced[0]:,} byte sequence(s) replaced with U+FFFD "
                         f"(first in {self.source.where(self.replaced[1], line=False)})")
        if self.surrogates[0]:
            lines.append(f"lone surrogates: {self.surrogates[0]:,} in JSON strings replaced with U+FFFD "
                         f"(first: {self.source.where(self.surrogates[1])})")
        for why, (count, origin, what) in self.skipped.items():
            lines.append(f"skipped {count:,} record(s) {why} (first: {self.source.where(origin)}: {what})")
        return lines
