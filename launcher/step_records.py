"""Each rank's training steps, timed in the worker and read by fleetrun at the job's end.

A step is one `Executor.run` of a program fleetlite compiled (fleetlite.runtime.training_steps).
Per step the worker keeps two numbers, from two clock reads: how long the step ran, and how long
the worker was outside any step before it (the input pipeline, the script's own host code, since
the previous step ended). That is all the end-of-job summary needs. With a timeline asked for
(`fleetrun --timeline`), each step's start on the wall clock is kept too, and the events the
compiled timestamp ops recorded inside it.

At the worker's end the bootstrap writes them as one JSON file, owner-only (0600, never through
a symlink), renamed into place so fleetrun never reads half a file; a worker that is killed
leaves none, and its summary row is missing.
"""
import time
from dataclasses import dataclass, field
from typing import List

from fleetlite.launcher.worker_records import read_record, write_record


@dataclass
class StepRecord:
    rank: int
    step_s: List[float] = field(default_factory=list)     # seconds each step ran
    host_s: List[float] = field(default_factory=list)     # seconds outside any step before each (0 for the first)
    start_s: List[float] = field(default_factory=list)    # wall-clock start of each step (timeline only)
    events: List[list] = field(default_factory=list)      # [step, name, start, seconds, args] (timeline only)


class StepRecorder:
    """The worker's side: `begin()` and `end()` around each training step."""

    def __init__(self, rank, timeline=False, clock=time.perf_counter, wall=time.time):
        self.record = StepRecord(rank)
        self.timeline = timeline
        self._clock, self._wall = clock, wall
        self._began = self._ended = None

    def begin(self):
        now = self._clock()
        self.record.host_s.append(0.0 if self._ended is None else now - self._ended)
        if self.timeline:
            self.record.start_s.append(self._wall())
        self._began = now

    def end(self, compiled_events=None):
        """`compiled_events`: the timestamp pairs compiled into the step's program
        (fleetlite.compile.step_events), read into timeline events when a timeline is asked for."""
        self._ended = self._clock()
        self.record.step_s.append(self._ended - self._began)
        if self.timeline and compiled_events:
            self._add_events(compiled_events)

    def _add_events(self, compiled_events):
        from fleetlite.compile import step_stamps     # Paddle is imported: the step just ran
        stamps = step_stamps.read(max(event["end"] for event in compiled_events) + 1)
        step, started = len(self.record.step_s) - 1, self.record.start_s[-1]
        for event in compiled_events:
            begin, end = stamps[event["begin"]], stamps[event["end"]]
            if started <= begin <= end:        # a stamp the step did not reach keeps an older time
                self.record.events.append([step, event["name"], begin, end - begin,
                                           {"kind": event["kind"], **event["args"]}])


def write_steps(path, record):
    write_record(path, record.__dict__)


def read_steps(path):
    return read_record(path, StepRecord)
