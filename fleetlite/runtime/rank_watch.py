"""Survivors name a rank that died, in fleetlite's words, and stop: for jobs no fleetrun supervises.

Under srun or mpirun a killed rank leaves the others blocked in a collective until gloo's timeout,
which then prints `gloo::TimeoutException` and Paddle's FatalError, naming nobody; the scheduler
alone says which task ended. So every rank keeps one more connection to rank 0's store (Paddle's
protocol, spoken by rendezvous_store.StoreClient) that says which rank and host it is, and
waits on the key `GONE_KEY`. The store (rendezvous_store) sees a watched connection close: a rank
that says `DONE_PREFIX<rank>` first has finished; one that does not is gone, and the store writes
`rank 2 on node1 is gone` under `GONE_KEY`, which wakes every other rank's watch at once. When
rank 0 dies the store dies with it, and the watches see their connection close. A woken watch
prints one line and ends its process (os._exit: the main thread is blocked in C++, and a rank that
lost a peer can do nothing more); the scheduler's own `--kill-on-bad-exit` then has nothing left.
fleetrun's workers do not watch: fleetrun supervises them and reports the root cause itself.
"""
import atexit
import contextlib
import os
import sys
import threading
import time

from fleetlite.runtime.rendezvous_store import DONE_PREFIX, GONE_KEY, WATCH_PREFIX, StoreClient
from fleetlite.topology import env_contract

WATCHED_LAUNCHERS = ("Open MPI", "Slurm")
CONNECT_TIMEOUT_S = 10
EXIT_STATUS = 1
FINISH_WAIT_S = 5
CRASH_GRACE_S = 2
STORE_LINGER_S = 1


def wanted(environ):
    """Whether this process's job is started by a scheduler that fleetrun does not supervise."""
    return env_contract.source_of(environ) in WATCHED_LAUNCHERS


class RankWatch:
    """This rank's watch connection to the store at `address:port`; `start` begins waiting."""

    def __init__(self, address, port, rank, host, master_host):
        self.rank, self._master_host = rank, master_host
        self._store = StoreClient(address, port, CONNECT_TIMEOUT_S)
        self._store.block(None)
        self._store.set(f"{WATCH_PREFIX}{rank}", host.encode())
        self._finished = False
        self._gone = None
        self._gone_said = threading.Event()
        self._stopping = threading.Lock()

    def start(self, exit_process=os._exit):
        """Wait in a daemon thread; on a lost rank print one line and call `exit_process`."""
        atexit.register(self.finish)
        previous_hook = sys.excepthook
        sys.excepthook = lambda *error: self.explain_crash(*error, previous_hook)
        self._thread = threading.Thread(target=self._wait, args=(exit_process,), name="fleetlite-rank-watch",
                                        daemon=True)
        self._thread.start()

    def _wait(self, exit_process):
        try:
            if not self._store.wait(GONE_KEY):
                return
            gone = self._store.get(GONE_KEY).decode()
        except OSError:
            gone = f"rank 0 on {self._master_host}, which served the job's store, is gone"
        if self._finished or not gone:   # this process, or the job, ended normally
            return
        self._gone = gone
        self._gone_said.set()
        self._stop("the job cannot go on without it", exit_process)

    def _stop(self, why, exit_process):
        if not self._stopping.acquire(blocking=False):   # the other thread says it and ends the process
            time.sleep(STORE_LINGER_S + CRASH_GRACE_S)
            return
        print(f"fleetlite: {self._gone}: stopping rank {self.rank} too ({why})", file=sys.stderr, flush=True)
        if self.rank == 0:   # the store ends with this process: let the other ranks read its word first
            time.sleep(STORE_LINGER_S)
        exit_process(EXIT_STATUS)

    def explain_crash(self, kind, value, traceback, previous_hook):
        """sys.excepthook while watching: a collective that failed because a rank died raises
        gloo's `Connection reset by peer` here before the store's word arrives; give the store a
        moment, and when a rank is gone say so (the root cause) instead of the cascade's traceback."""
        if self._gone_said.wait(CRASH_GRACE_S):
            last_line = (str(value).strip().splitlines() or [""])[-1]
            self._stop(f"its own error is a consequence: {kind.__name__}: {last_line}", os._exit)
        previous_hook(kind, value, traceback)

    def finish(self):
        """Tell the store this rank ended normally, then close the watch. Rank 0 waits (bounded)
        until its store has told the others that the job ended: the store dies with this process."""
        if self._finished:
            return
        self._finished = True
        with contextlib.suppress(OSError):     # the store already ended with rank 0: nobody is left to tell
            self._store.set(f"{DONE_PREFIX}{self.rank}", b"1")
            if self.rank == 0:
                self._thread.join(FINISH_WAIT_S)
        self._store.close()
