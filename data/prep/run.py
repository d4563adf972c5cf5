"""One run of prepare.py (Run): the documents in their order (order.py) cut into worker tasks, tokenized by the pool
(pool.py, tasks.py), each document given whole to val or train and written into shards as they fill (shards.py), the
resume state saved after each complete shard (state.py) and taken up by --resume. Reads the inputs; writes the
shards, the state file and the tokenizer copy in the output folder.
"""

import codecs
import collections
import contextlib
import os
import signal
import time
from array import array

from .errors import PrepareError, ResumableError
from .order import DOC_OVERHEAD, data_size, prefetch, shuffled_blocks
from .pool import TASK_BYTES, WorkerPool, tasks_ahead
from .progress import Progress
from .readers import ITEM_BYTES, ITEM_PIECE, ITEM_TEXT
from .shards import SplitWriter, bytes_per_token, copy_tokenizer, limit_test_disk, remove_quietly, remove_shards
from .state import STATE_VERSION, read_state, state_path, write_state
from .tasks import InputStats, TaskEncoder
from .tokenizers import cut_pieces


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
        limit_test_disk()  # PREPARE_TEST_DISK_BYTES

    def complete_shards(self):
        return sum(len(w.written) for w in self.writers.values())

    # ------------------------------------------------------------ state

    def save_state(self):
        """Record where the stream stands: the document being written and how many of its tokens the complete
        shards hold. A resumed run that has not yet passed the tokens it drops (those of the document it resumed in,
        which the shards hold already) stands where it resumed: offset + drop tokens are written, not offset."""
        written = self.offset + self.drop
        state = {"version": STATE_VERSION, "options": self.options, "inputs": self.inputs,
                 "item": self.doc, "into_doc": written - self.doc_start, "split": self.split,
                 "offset": written, "counts": self.counts, "counted": self.counted, "stats": self.doc_stats,
                 "shards": {split: [[os.path.basename(path), count] for path, count in w.written]
                            for split, w in self.writers.items()}}
        write_state(state_path(self.out_dir, self.name), state)

    def resume(self):
        """Take up the interrupted run recorded in the state file, or say why not."""
        state = read_state(state_path(self.out_dir, self.name), self.options, self.inputs, self.out_dir,
                           self.itemsize + self.masked)
        for split, shards in state["shards"].items():
            self.writers[split].written = [(os.path.join(self.out_dir, name), count) for name, count in shards]
        if state["item"] >= 0:
            self.skip_items, self.drop, self.resumed_split = state["item"], state["into_doc"], state["split"]
            self.item, self.offset = state["item"] - 1, state["offset"] - state["into_doc"]
            # the document being written is the one resumed in, until the next begins: a state saved before then
            # (this run killed before it completes a shard) is the position resumed from, not the start
            self.doc, self.doc_start, self.split = state["item"], self.offset, state["split"]
        self.counts, self.counted = state["counts"], state["counted"]
        self.stats.restore(state["stats"])
        self.doc_stats = state["stats"]
        self.resumed = True

    def remove_output(self):
        """After an error in the inputs: no shard of this run is left for a glob to pick up (best-effort: never
        raises, as it runs while that error is being told)."""
        for writer in self.writers.values():
            writer.written = []
        with contextlib.suppress(OSError):
            remove_shards(self.out_dir, self.name)
        remove_quietly(state_path(self.out_dir, self.name))

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
            # Clean up best-effort: nothing here may raise over e, which is what is told (a full disk, say, fails
            # again as the half-written shard's buffer is flushed on closing it).
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
                per_byte = nbytes / max(1, sum(data_size(data) for _, data, _ in payload))
                for i, (kind, data, origin) in enumerate(payload):
                    payload[i] = None  # handed on: the block's memory goes as it is tokenized
                    item += 1
                    if item < self.skip_items:
                        self.progress.skip(data_size(data) * per_byte)
                    elif kind in (ITEM_BYTES, ITEM_TEXT) and len(data) > TASK_BYTES:
                        text = data if kind == ITEM_TEXT else data.decode("utf-8", "surrogateescape")
                        for j, piece in enumerate(cut_pieces((text,))):
                            yield (ITEM_PIECE if j else ITEM_TEXT), piece, origin, len(piece) * per_byte
                    else:
                        yield kind, data, origin, data_size(data) * per_byte
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
            size += data_size(data) + DOC_OVERHEAD
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
