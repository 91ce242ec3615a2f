"""The job's failure, said once: the root cause, its victims, and the ranks that were behind.

`read_end` gathers what a finished worker left (exit status, error record, progress, log);
the rest is pure: `diagnose` decides who is to blame and `format_report` says it.

- A rank *failed* when it exited non-zero on its own, or had recorded an uncaught exception
  before fleetrun stopped it. Ranks fleetrun stopped without either are listed as stopped,
  never blamed.
- A failure whose exception is a collective losing its peer (gloo's transport errors, its bare
  `std::exception` in static programs, NCCL's remote error) makes the rank a *victim*.
- A remote host's fleetrun (under --ssh) that ended without its report lost its connection
  (the host went down, the link was cut, or ssh never started it): that is a failure of the
  host even when fleetrun was already stopping it, and the report says so with its ranks.
- The *root cause* is the earliest failure that is not a victim. If every failure is a victim,
  a rank stalled or the cause is on another host: the report then names the ranks that had
  entered fewer steps than the first victim (from the progress files).
"""
import os
import signal
from dataclasses import dataclass
from typing import Optional, Tuple

from fleetlite.launcher.worker_records import ErrorRecord, Progress, read_error, read_progress

PEER_FAILURE_MARKERS = ("gloo/transport", "std::exception", "ncclRemoteError")
LOG_TAIL_LINES = 20
LOG_TAIL_BYTES = 64 * 1024
MESSAGE_CHARS = 300


@dataclass(frozen=True)
class WorkerEnd:
    """How one process of the job ended, with what it left behind."""
    name: str
    host: str
    pid: int
    returncode: Optional[int]  # None: it survived SIGKILL
    time: float
    stopped: bool = False      # fleetrun signalled it before it ended
    rank: Optional[int] = None
    error: Optional[ErrorRecord] = None
    progress: Optional[Progress] = None
    log_path: Optional[str] = None
    log_tail: Tuple[str, ...] = ()
    teed: bool = False         # its output already went to the console
    remote: bool = False       # a whole host's fleetrun, which reports for itself
    lost: Optional[str] = None  # a remote host whose connection was lost: how, and its ranks

    @property
    def failed(self):
        return self.returncode not in (0, None) and (
            not self.stopped or self.error is not None or self.lost is not None)

    @property
    def victim(self):
        return self.failed and self.error is not None and any(
            marker in self.error.message for marker in PEER_FAILURE_MARKERS)

    @property
    def failure_time(self):
        return self.error.time if self.error else self.time


@dataclass(frozen=True)
class Diagnosis:
    root: Optional[WorkerEnd]
    victims: Tuple[WorkerEnd, ...] = ()
    other_failures: Tuple[WorkerEnd, ...] = ()
    stopped: Tuple[WorkerEnd, ...] = ()
    behind: Tuple[WorkerEnd, ...] = ()
    unkillable: Tuple[WorkerEnd, ...] = ()


def diagnose(ends, blame_victims=True):
    """Who is to blame. With blame_victims=False (the job was stopped from outside, e.g. by the
    first host of an --ssh job), a victim is never made the root cause."""
    failures = sorted((e for e in ends if e.failed), key=lambda e: e.failure_time)
    causes = [e for e in failures if not e.victim]
    root = (causes or (failures if blame_victims else []) or [None])[0]
    behind = ()
    if root is not None and root.victim and root.progress is not None:
        behind = tuple(sorted((e for e in ends if e.progress and e.progress.steps < root.progress.steps),
                              key=lambda e: e.rank))
    return Diagnosis(
        root=root,
        victims=tuple(e for e in failures if e.victim and e is not root),
        other_failures=tuple(causes[1:]),
        stopped=tuple(sorted((e for e in ends if e.stopped and not e.failed and e.returncode is not None),
                             key=lambda e: (e.rank is None, e.rank or 0, e.name))),
        behind=behind,
        unkillable=tuple(e for e in ends if e.returncode is None))


def exit_code(diagnosis, stop_signum=None):
    """The root cause's exit code (128 + N for signal N, as shells do); else 128 + the signal
    that stopped fleetrun; else 0."""
    if diagnosis.root is not None:
        code = diagnosis.root.returncode
        return code if code > 0 else 128 - code
    return 128 + stop_signum if stop_signum else 0


def describe_exit(end):
    if end.returncode is None:
        return "did not exit after SIGKILL"
    if end.returncode < 0:
        return f"was killed by {signal.Signals(-end.returncode).name}"
    return f"exited with code {end.returncode}"


def _first_line(error):
    message = error.message.strip().splitlines()[0] if error.message.strip() else ""
    return f"{error.exception}: {message[:MESSAGE_CHARS]}"


def _where(end):
    return f"{end.name} on {end.host} (pid {end.pid})"


def _root_lines(root):
    if root.remote and root.lost:
        return [f"fleetrun: root cause: {root.lost}"]
    if root.remote:
        return [f"fleetrun: the job failed on {root.host}: its fleetrun {describe_exit(root)} "
                f"(its report is above)"]
    if not root.victim:
        lines = [f"fleetrun: root cause: {_where(root)} {describe_exit(root)}"]
    else:
        lines = [f"fleetrun: {_where(root)} {describe_exit(root)} after a collective failed; no "
                 f"rank on this host failed on its own: a rank stalled, or the cause is on another host"]
    if root.error:
        lines.append(f"  {_first_line(root.error)}")
    if root.teed:
        lines.append(f"  its output{', traceback included,' if root.error else ''} is above "
                     f"(the lines prefixed [{root.name}])")
        return lines
    if root.error:
        lines += ["  traceback:"] + ["    " + line for line in root.error.traceback.rstrip("\n").splitlines()]
    if root.log_tail:
        lines += [f"  last {len(root.log_tail)} lines of {root.log_path}:"]
        lines += ["    " + line for line in root.log_tail]
    return lines


def _names(ends, detail):
    return ", ".join(f"{e.name} ({detail(e)})" for e in ends)


def format_report(diagnosis, now):
    """The report's lines, or [] when nothing failed."""
    root = diagnosis.root
    lines = [] if root is None else _root_lines(root)
    if diagnosis.behind:
        lines.append(f"  likely cause, ranks that had not reached the collective {root.name} waited in: " +
                     _names(diagnosis.behind, lambda e: f"entered {e.progress.steps} of "
                            f"{root.progress.steps} steps, the last {now - e.progress.time:.1f} s ago"))
    if diagnosis.victims:
        lines.append(f"  victims (a collective failed because a peer was gone): "
                     + _names(diagnosis.victims, lambda e: _first_line(e.error)))
    if diagnosis.other_failures:
        lines.append("  also failed, later: " + _names(diagnosis.other_failures, describe_exit))
    if diagnosis.stopped:
        lines.append("  stopped by fleetrun: " + ", ".join(e.name for e in diagnosis.stopped))
    if diagnosis.unkillable:
        lines.append("  WARNING: still running after SIGKILL: " + _names(diagnosis.unkillable, lambda e: f"pid {e.pid}"))
    return lines


def _log_tail(path, start, error):
    """The last lines of this attempt's log, without the traceback the report shows anyway."""
    try:
        with open(path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(start, size - LOG_TAIL_BYTES))
            text = log.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ()
    if error and error.traceback.strip():
        at = text.rfind(error.traceback.strip())
        if at >= 0:
            text = text[:at] + text[at + len(error.traceback.strip()):]
    return tuple(line for line in text.splitlines() if line.strip())[-LOG_TAIL_LINES:]


def read_end(ended):
    """A supervisor `Ended` as a WorkerEnd, reading the worker's records and log."""
    process, slot = ended.process, ended.process.slot
    common = dict(name=process.name, host=process.host, pid=process.pid,
                  returncode=ended.returncode, time=ended.time, stopped=ended.stopped)
    if slot is None:
        lost = process.lost(ended.returncode) if ended.returncode is not None else None
        return WorkerEnd(remote=True, lost=lost, **common)
    error = read_error(slot.error_file)
    return WorkerEnd(rank=slot.rank, error=error, progress=read_progress(slot.progress_file),
                     log_path=slot.log_path, log_tail=_log_tail(slot.log_path, process.log_start, error),
                     teed=process.teed, **common)
