"""The progress line on stderr (Progress) and how sizes and times are shown. Writes to stderr only.
"""

import sys
import time


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
