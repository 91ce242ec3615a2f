"""What a worker leaves for its launcher: an error file and a progress file.

The bootstrap writes them inside the worker and the failure report reads them in fleetrun;
both sides live here so the formats cannot drift.
- Error file (JSON): the uncaught exception's type, message and traceback, and when it was
  raised. Written once, atomically, so a worker killed mid-write leaves none rather than half.
- Progress file: how many training steps the worker has *entered*, and when it last entered
  one. A rank stalled before a collective has entered fewer steps than the ranks waiting
  inside it, which is how a timeout names the ranks that were behind. It also says which
  fleet-level collective the worker waits in now, if any (its kind, how many fleet-level
  collectives the worker had entered, the script line that called it, since when): ranks
  waiting in different ones are stuck, which is how fleetrun stops such a job early.
  It also counts the training steps (runs of a compiled program) and their samples, and keeps
  what the script reported (fleet.report_progress): fleetrun's live progress line reads rank 0's.
"""
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Optional

from fleetlite.interprocess.private_paths import open_private_file

PROGRESS_RECORD_BYTES = 1024  # fixed width: each update overwrites the last in place
WHERE_CHARS = 100             # so a record always fits, even with every character escaped


@dataclass(frozen=True)
class ErrorRecord:
    exception: str
    message: str
    traceback: str
    time: float


@dataclass(frozen=True)
class CollectiveWait:
    kind: str        # e.g. 'fleet.util.barrier'
    sequence: int    # the worker's how-manyth fleet-level collective this is
    where: str       # 'train.py:42', the script line that called it
    since: float


@dataclass(frozen=True)
class Progress:
    steps: int
    time: float
    collective: Optional[CollectiveWait] = None   # the one it waits in now
    trained: int = 0                     # training steps entered
    samples: int = 0                     # samples this rank fed them
    loss: Optional[float] = None         # the last one the script reported
    total_steps: Optional[int] = None    # the number of training steps the script said it runs


def write_record(path, record):
    """`record` (a JSON dict) into `path`: owner-only, never through a symlink, renamed into place
    so that a reader sees the whole file or none."""
    partial = f"{path}.partial"
    with os.fdopen(open_private_file(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as out:
        json.dump(record, out)
    os.replace(partial, path)


def read_record(path, kind):
    """`kind(**record)` of the file `write_record` wrote; None when it is missing or unreadable."""
    try:
        with open(path) as source:
            return kind(**json.load(source))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def write_error(path, exc, traceback_text):
    write_record(path, {"exception": type(exc).__name__, "message": str(exc), "time": time.time(),
                        "traceback": traceback_text})


def read_error(path):
    return read_record(path, ErrorRecord)


class ProgressWriter:
    """The worker's side; also the listener of fleetlite.runtime.collective_waits."""

    def __init__(self, path):
        self.steps, self.collectives = 0, 0
        self.trained, self.samples, self.loss, self.total_steps = 0, 0, None, None
        self._step_time, self._wait = time.time(), None
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def enter_step(self, samples=None):
        """`samples`: this rank's batch size when the step is a training step, else None."""
        self.steps += 1
        if samples is not None:
            self.trained += 1
            self.samples += samples
        self._step_time = time.time()
        self._write()

    def report(self, loss, total_steps):
        """The listener of fleetlite.runtime.training_steps."""
        self.loss = self.loss if loss is None else loss
        self.total_steps = self.total_steps if total_steps is None else total_steps
        self._write()

    def enter_collective(self, kind, where):
        self.collectives += 1
        self._wait = CollectiveWait(kind, self.collectives, where[-WHERE_CHARS:], time.time())
        self._write()

    def leave_collective(self):
        self._wait = None
        self._write()

    def _write(self):
        record = {"steps": self.steps, "time": round(self._step_time, 3),
                  "collective": self._wait and asdict(self._wait), "trained": self.trained,
                  "samples": self.samples, "loss": self.loss, "total_steps": self.total_steps}
        text = json.dumps(record).ljust(PROGRESS_RECORD_BYTES - 1) + "\n"
        os.pwrite(self._fd, text.encode(), 0)


def read_progress(path):
    try:
        with open(path) as source:
            record = json.load(source)
        wait = record["collective"]
        return Progress(int(record["steps"]), float(record["time"]), wait and CollectiveWait(**wait),
                        int(record["trained"]), int(record["samples"]), record["loss"], record["total_steps"])
    except (FileNotFoundError, ValueError, TypeError, KeyError):
        return None


def clear_records(*paths):
    """Remove a previous attempt's records, making their folder if needed."""
    for path in paths:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        try:
            os.remove(path)
        except FileNotFoundError:
            continue
