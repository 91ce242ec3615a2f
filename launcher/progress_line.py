"""fleetrun's live progress: rank 0's training step, samples/s, last loss, elapsed time, ETA.

Read from rank 0's progress record, which the worker rewrites at every step anyway
(worker_records): the worker does nothing more for it. On a terminal it is one line redrawn in
place, wiped before each line of rank 0's log is copied to the console (LogTee's
`before_lines`) and redrawn after; elsewhere (a file, a pipe, CI logs) a plain line every
PLAIN_INTERVAL_S seconds, so logs hold no carriage returns. `fleetrun --quiet` turns it off.
Samples/s counts every rank (rank 0's batch times the world size: data-parallel ranks feed equal
batches); the loss is what the script last reported (`fleet.report_progress(loss=...)`), the
ETA needs the number of steps it said it runs (`total_steps=`).
"""
import threading
import time

from fleetlite.launcher.worker_records import read_progress

REDRAW_S = 0.5
PLAIN_INTERVAL_S = 30.0
WIPE = "\r\x1b[K"


def _clock(seconds):
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def describe(progress, first, world_size, elapsed):
    """The progress line for rank 0's `progress` record; `first`: its first record with a training
    step (rates are averaged from there); `elapsed`: seconds since the job started."""
    total = f"/{progress.total_steps}" if progress.total_steps else ""
    parts = [f"step {progress.trained}{total}"]
    span = progress.time - first.time
    steps_per_s = (progress.trained - first.trained) / span if span > 0 else None
    if steps_per_s:
        parts.append(f"{(progress.samples - first.samples) * world_size / span:.0f} samples/s")
    if progress.loss is not None:
        parts.append(f"loss {progress.loss:.4g}")
    parts.append(f"{_clock(elapsed)} elapsed")
    if steps_per_s and progress.total_steps:
        parts.append(f"ETA {_clock(max(0, progress.total_steps - progress.trained) / steps_per_s)}")
    return " | ".join(parts)


class ProgressLine:
    """Shows rank 0's progress on `out` (a text stream) while a job attempt runs."""

    def __init__(self, out, interval=None, clock=time.monotonic):
        self._out, self._clock = out, clock
        self.terminal = out.isatty()
        self._interval = interval or (REDRAW_S if self.terminal else PLAIN_INTERVAL_S)
        self._lock = threading.Lock()
        self._shown = ""
        self._thread = None
        self._done = threading.Event()

    def start(self, progress_file, world_size):
        self._done.clear()
        self._thread = threading.Thread(target=self._follow, args=(progress_file, world_size, self._clock()),
                                        name="progress line", daemon=True)
        self._thread.start()

    def stop(self, timeout=2.0):
        if self._thread is not None:
            self._done.set()
            self._thread.join(timeout)
            self._thread = None
        self.clear()

    def clear(self):
        """Wipe the line from a terminal (before something else is printed)."""
        with self._lock:
            if self._shown:
                self._out.write(WIPE)
                self._out.flush()
                self._shown = ""

    def _follow(self, progress_file, world_size, started):
        first = None
        while not self._done.wait(self._interval):
            progress = read_progress(progress_file)
            if progress is None or progress.trained == 0:
                continue
            first = first or progress
            self._show(describe(progress, first, world_size, self._clock() - started))

    def _show(self, line):
        with self._lock:
            if self.terminal:
                self._out.write(f"{WIPE}fleetrun: {line}")
                self._shown = line
            else:
                self._out.write(f"fleetrun: progress: {line}\n")
            self._out.flush()
