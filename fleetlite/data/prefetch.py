"""Reading pipelined behind compute: a thread keeps the next batches ready while a step runs.

The executor releases the GIL while it runs a program, and numpy copies and PIL decoding
release it too, so one reader thread overlaps the step. `wait_s` is the time the consumer
spent blocked on the queue: the data stall. Readers still running at exit are stopped first.
"""
import atexit
import queue
import threading
import time
import weakref

from fleetlite.errors import DataError

_DONE = object()
_RUNNING = weakref.WeakSet()


@atexit.register
def _stop_readers():
    """Stop every reader before the interpreter shuts down: a daemon thread still decoding
    while modules and memory maps are torn down can crash the process at exit."""
    for reader in list(_RUNNING):
        reader.close()


class Prefetcher:
    """Iterate `items` in a background thread, at most `depth` items ahead of the consumer.
    An exception in the reader is raised in the consumer; a reader silent for `timeout`
    seconds is an error naming it (no wait is unbounded)."""

    def __init__(self, items, depth=4, timeout=600.0, name="fleetlite-prefetch"):
        if depth < 1:
            raise DataError(f"prefetch depth {depth}: it must be >= 1")
        self.timeout, self.wait_s = timeout, 0.0
        self._queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(iter(items),), name=name, daemon=True)
        self._thread.start()
        _RUNNING.add(self)

    def _read(self, items):
        try:
            for item in items:
                if not self._put((item, None)):
                    return
            self._put((_DONE, None))
        except BaseException as error:   # handed to the consumer, which raises it
            self._put((_DONE, error))

    def _put(self, entry):
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self):
        return self

    def __next__(self):
        start = time.perf_counter()
        try:
            item, error = self._queue.get(timeout=self.timeout)
        except queue.Empty:
            self.close()
            raise DataError(f"the data reader thread produced nothing for {self.timeout:.0f} s") from None
        finally:
            self.wait_s += time.perf_counter() - start
        if item is _DONE:
            self._thread.join(timeout=self.timeout)
            if error is not None:
                raise error
            raise StopIteration
        return item

    def close(self):
        """Stop the reader (an epoch left early)."""
        self._stop.set()
        self._thread.join(timeout=self.timeout)
