"""What a worker leaves for its launcher: an error file and a progress file.

The bootstrap writes them inside the worker and the failure report reads them in fleetrun;
both sides live here so the formats cannot drift.
- Error file (JSON): the uncaught exception's type, message and traceback, and when it was
  raised. Written once, atomically, so a worker killed mid-write leaves none rather than half.
- Progress file: how many training steps the worker has *entered*, and when it last entered
  one. A rank stalled before a collective has entered fewer steps than the ranks waiting
  inside it, which is how a timeout names the ranks that were behind.
"""
import json
import os
import time
from dataclasses import dataclass

PROGRESS_LINE_BYTES = 40  # fixed width: each update overwrites the last in place


@dataclass(frozen=True)
class ErrorRecord:
    exception: str
    message: str
    traceback: str
    time: float


@dataclass(frozen=True)
class Progress:
    steps: int
    time: float


def write_error(path, exc, traceback_text):
    record = {"exception": type(exc).__name__, "message": str(exc), "time": time.time(),
              "traceback": traceback_text}
    partial = f"{path}.partial"
    with open(partial, "w") as out:
        json.dump(record, out)
    os.replace(partial, path)


def read_error(path):
    try:
        with open(path) as source:
            return ErrorRecord(**json.load(source))
    except (FileNotFoundError, ValueError, TypeError):
        return None


class ProgressWriter:
    def __init__(self, path):
        self.steps = 0
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def enter_step(self):
        self.steps += 1
        line = f"{self.steps} {time.time():.3f}".ljust(PROGRESS_LINE_BYTES - 1) + "\n"
        os.pwrite(self._fd, line.encode(), 0)


def read_progress(path):
    try:
        with open(path) as source:
            steps, when = source.read().split()
        return Progress(int(steps), float(when))
    except (FileNotFoundError, ValueError):
        return None


def clear_records(*paths):
    """Remove a previous attempt's records, making their folder if needed."""
    for path in paths:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        try:
            os.remove(path)
        except FileNotFoundError:
            continue
