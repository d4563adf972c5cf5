"""The pool of tokenizer processes (WorkerPool): tasks go to the worker with the fewest in flight, and their results
come back in task order; how many tasks may be in flight and ahead (tasks_ahead). Forked, so the workers share what
the main process loaded (the tokenizer). Reads and writes nothing but the pipes to its workers.
"""

import collections
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import signal
import threading
import time
import traceback

from .errors import ResumableError


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
