"""Shard files: the format (a 1024-byte header, the tokens, the loss mask of masked shards; docs/shard_format.md),
written as the tokens come (ShardFile, SplitWriter: to NAME.tmp, renamed when complete), read back and checked
(read_shard, check_shards), the tokenizer file copied beside them. Writes the shards and the tokenizer copy in the
output folder (every output file goes through output_file, where the tests can make the disk full).
"""

import contextlib
import errno
import io
import os
import re
import shutil
import struct
import sys
import tempfile
from array import array

from .errors import PrepareError


MAGIC = 0x4C4C5453
VERSION = 1         # tokens
VERSION_MASKED = 2  # tokens, then a loss mask of one byte per token (1: predicting this token counts)
HEADER_BYTES = 1024
HEADER_STRUCT = struct.Struct("<iiiiQii")  # the used prefix of the 256 x int32 header


class _TestDisk:
    """PREPARE_TEST_DISK_BYTES=N: the tests' way to fill the disk at a known point. The output files (shards, the
    state file, the tokenizer copy) take N bytes in all, then every write fails with ENOSPC, as on a full disk (a
    write that does not fit is cut short first). None: no limit."""
    left = None


def limit_test_disk():
    """Take the PREPARE_TEST_DISK_BYTES limit, if set, for the output files written from now on."""
    disk = os.environ.get("PREPARE_TEST_DISK_BYTES")
    _TestDisk.left = int(disk) if disk else None


class _OutputFileIO(io.FileIO):
    def write(self, data):
        if _TestDisk.left is None:
            return super().write(data)
        if _TestDisk.left <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.name)
        data = memoryview(data).cast("B")[:_TestDisk.left]
        written = super().write(data)
        _TestDisk.left -= written
        return written


def output_file(path, mode="wb"):
    """A new output file, opened for writing ("wb" or "w"); through the PREPARE_TEST_DISK_BYTES limit, if set."""
    if _TestDisk.left is None:
        return open(path, mode)
    buffered = io.BufferedWriter(_OutputFileIO(path, "w"))
    return buffered if mode == "wb" else io.TextIOWrapper(buffered, encoding="utf-8")


def remove_quietly(path):
    """Remove a file if it is there, as part of cleaning up after an error: never raises; False if it stays."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


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
        self.file = output_file(path + ".tmp")
        self.mask = None
        try:
            self.file.write(bytes(HEADER_BYTES))
            self.mask = tempfile.TemporaryFile(dir=os.path.dirname(path) or ".") if masked else None
        except BaseException:
            self.abort()
            raise

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
        """Drop the half-written shard, best-effort: called after an error (a full disk fails again when the file's
        buffer is flushed on closing it), so it never raises one of its own; the error before it is the one told."""
        for f in (self.file, self.mask):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()  # the buffer is flushed first; closed even when that fails
        remove_quietly(self.path + ".tmp")


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
        """Drop the shard being written, if any (best-effort: never raises)."""
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


def tokenizer_copy_path(out_dir, name):
    return os.path.join(out_dir, f"{name}_tokenizer.model")


def copy_tokenizer(tokenizer, out_dir, name):
    """The tokenizer file beside the shards as NAME_tokenizer.model, where the trainers look for it
    (samples, exports); written to a temporary name and renamed, like the shards."""
    if not tokenizer.path:
        return
    dest = tokenizer_copy_path(out_dir, name)
    tmp = dest + ".tmp"
    try:
        with open(tokenizer.path, "rb") as src, output_file(tmp) as f:
            shutil.copyfileobj(src, f)
        os.replace(tmp, dest)
    except BaseException:
        remove_quietly(tmp)
        raise
