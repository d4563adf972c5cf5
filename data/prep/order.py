"""The order in which documents are written: shuffled with --seed in blocks of --buffer-mb (shuffled_blocks), the
next block read by a thread while this one is tokenized (prefetch). Reads the inputs through a Source; writes
nothing.
"""

import queue
import random
import threading


DOC_OVERHEAD = 64  # counted against --buffer-mb for each document: what it costs beyond its text


def data_size(data):
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
        held += data_size(data) + DOC_OVERHEAD
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
