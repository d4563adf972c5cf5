"""Input files opened for reading as byte streams, decompressed: .gz (through python-isal's igzip where it is
installed, else gzip) and .zst (zstandard), with a truncated file of either an error (EOFError, as gzip raises it),
and what reading a bad input raises (read_errors). Reads the input files; writes nothing.
"""

import contextlib
import gzip
import io
import os
import sys
import zlib


COMPRESSIONS = (".gz", ".zst")
READ_BYTES = 1 << 20  # text files are read and split this much at a time


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
            yield io.BufferedReader(ZstdReader(raw), buffer_bytes), raw
        else:
            yield raw, raw


TRUNCATED = "Compressed file ended before the end-of-stream marker was reached"  # gzip's words for it


class ZstdReader(io.RawIOBase):
    """The decompressed stream of a .zst file (its frames one after another, as zstd -d gives them), through
    zstandard's stream reader; at its end, EOFError(TRUNCATED) if the file ends inside a frame, where the stream
    reader just stops."""

    def __init__(self, raw):
        import zstandard
        self.raw = raw
        self.reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=False)
        self.checked = False

    def readable(self):
        return True

    def readinto(self, buffer):
        n = self.reader.readinto(buffer)
        if n == 0 and not self.checked:
            size = os.fstat(self.raw.fileno()).st_size
            if zstd_frames_end(self.raw.fileno(), size) != size:
                raise EOFError(TRUNCATED)
            self.checked = True
        return n

    def close(self):
        self.reader.close()
        super().close()


ZSTD_MAGIC = 0xFD2FB528
ZSTD_SKIPPABLE = 0x184D2A50  # to 0x184D2A5F


def zstd_frames_end(fd, size):
    """Where the zstd frames of the file fd (of size bytes) end, by their headers (RFC 8878): size if the last one
    is whole, more if the file ends inside it. Reads a few bytes per block (of up to 128 KiB of output), past the
    position of fd, which stays; the data itself was checked by decompressing it."""
    import zstandard
    pos = 0
    while pos < size:
        head = os.pread(fd, 18, pos)  # the longest frame header: magic, descriptor, window, dictionary id, size
        if len(head) < 8:
            return size + 1
        magic = int.from_bytes(head[:4], "little")
        if magic & 0xFFFFFFF0 == ZSTD_SKIPPABLE:
            pos += 8 + int.from_bytes(head[4:8], "little")
            continue
        if magic != ZSTD_MAGIC:
            raise zstandard.ZstdError(f"no zstd frame at byte {pos:,}")
        descriptor = head[4]
        single_segment = descriptor >> 5 & 1
        content_size_bytes = (single_segment, 2, 4, 8)[descriptor >> 6]
        pos += 5 + (not single_segment) + (0, 1, 2, 4)[descriptor & 3] + content_size_bytes
        while True:
            block = os.pread(fd, 3, pos)
            if len(block) < 3:
                return size + 1
            header = int.from_bytes(block, "little")
            pos += 3 + (1 if header >> 1 & 3 == 1 else header >> 3)  # an RLE block holds its byte once
            if header & 1:  # the last block
                break
        pos += 4 if descriptor >> 2 & 1 else 0  # the content checksum
    return pos


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
