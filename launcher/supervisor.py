"""All-or-nothing supervision of a group of processes.

`watch` returns as soon as one process fails, a stop is requested, the processes are found
stalled, or all have ended: a rank that dies leaves its peers blocked in a collective (gloo
gives up only after 30 s), so waiting for them would only delay the report. `stop_processes` then ends the rest: SIGTERM, a bounded
grace, SIGKILL, a bounded wait for the kernel. A second Ctrl-C skips the grace.
"""
import signal
import threading
import time
from dataclasses import dataclass
from typing import Optional

POLL_INTERVAL_S = 0.05
GRACE_S = 5.0
KILL_WAIT_S = 5.0


class StopRequest:
    """Why fleetrun was asked to stop the job (SIGINT, SIGTERM, or the leader's stdin closing)."""

    def __init__(self):
        self.signum, self.reason, self.count = None, None, 0
        self._event = threading.Event()

    def request(self, signum, reason=None):
        if self.signum is None:
            self.signum, self.reason = signum, reason or signal.Signals(signum).name
        self.count += 1
        self._event.set()

    def install(self):
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda received, _frame: self.request(received))

    def is_set(self):
        return self._event.is_set()

    def wait(self, timeout):
        return self._event.wait(timeout)

    @property
    def urgent(self):
        """Asked twice: skip the grace period."""
        return self.count > 1


@dataclass(frozen=True)
class Ended:
    process: object
    returncode: Optional[int]  # None: still there after SIGKILL and the wait
    time: float               # wall clock, comparable with the workers' error records
    stopped: bool = False     # fleetrun signalled it first


def _poll(running, ended, stopped, clock):
    for process in list(running):
        code = process.poll()
        if code is not None:
            running.remove(process)
            ended.append(Ended(process, code, clock(), stopped))


def watch(processes, stop, poll_interval=POLL_INTERVAL_S, clock=time.time, stalled=lambda: None):
    """Poll until a process fails, `stop` is set, `stalled()` says something, or every process
    has ended; returns the processes that ended meanwhile (the rest are still running)."""
    running, ended = list(processes), []
    while running:
        _poll(running, ended, False, clock)
        if stop.is_set() or any(e.returncode != 0 for e in ended) or stalled():
            break
        stop.wait(poll_interval)
    return ended


def _wait_for_ends(running, ended, seconds, cut_short, poll_interval, clock):
    deadline = time.monotonic() + seconds
    while running and time.monotonic() < deadline and not cut_short():
        _poll(running, ended, True, clock)
        time.sleep(poll_interval)
    _poll(running, ended, True, clock)


def stop_processes(processes, stop, grace=GRACE_S, kill_wait=KILL_WAIT_S,
                   poll_interval=POLL_INTERVAL_S, clock=time.time):
    """End `processes` (none of them reported ended yet); returns how each ended."""
    running, ended = list(processes), []
    _poll(running, ended, False, clock)  # those that ended on their own since `watch`
    for process in running:
        process.terminate()
    _wait_for_ends(running, ended, grace, lambda: stop.urgent, poll_interval, clock)
    for process in running:
        process.kill()
    _wait_for_ends(running, ended, kill_wait, lambda: False, poll_interval, clock)
    return ended + [Ended(p, None, clock(), True) for p in running]
