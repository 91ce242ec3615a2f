"""One tuning trial: the user's job started through fleetrun's own machinery (plan, transport,
supervisor) with the trial's environment, watched while it runs.

The watcher reads the step times the workers append (trial_worker) and stops the job through the
supervisor's StopRequest as soon as every rank has written its timings, or earlier when the
trial is clearly losing (search.stop_early), when it outlives its allowance, or when fleetrun
itself is asked to stop. The trial's fleetrun output and worker
logs go to its own directory, not to the console.
"""
import json
import os
import shutil
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

from fleetlite.errors import LaunchError
from fleetlite.launcher.job import Job
from fleetlite.launcher.preflight import run_preflight
from fleetlite.launcher.supervisor import StopRequest
from fleetlite.launcher.transport import LocalTransport
from fleetlite.tuning import search, trial_worker

WATCH_INTERVAL_S = 0.1


def read_timings(directory, ranks):
    """(slowest rank's time per step, slowest rank's sync ms or None) from the workers' files."""
    per_rank, sync = [], []
    for rank in ranks:
        path = trial_worker.timings_path(directory, rank)
        steps, rank_sync = [], None
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    record = json.loads(line)
                except ValueError:       # a line still being written
                    continue
                if "step_ms" in record:
                    steps.append(record["step_ms"])
                if "sync_ms" in record:
                    rank_sync = record["sync_ms"]
        per_rank.append(steps)
        sync.append(rank_sync)
    slowest = tuple(max(step) for step in zip(*per_rank)) if per_rank else ()
    return slowest, (max(sync) if sync and None not in sync else None)


class _Watcher(threading.Thread):
    def __init__(self, directory, ranks, stop, outer_stop, allowance_s, best_ms):
        super().__init__(name="tune trial watcher", daemon=True)
        self.directory, self.ranks, self.stop, self.outer_stop = directory, ranks, stop, outer_stop
        self.deadline = time.monotonic() + allowance_s
        self.allowance_s, self.best_ms = allowance_s, best_ms
        self.reason, self.done = None, threading.Event()

    def _stop_trial(self, reason):
        self.reason = reason
        self.stop.request(signal.SIGTERM, reason)

    def run(self):
        while not self.done.wait(WATCH_INTERVAL_S):
            if self.outer_stop.is_set():
                return self._stop_trial(f"fleetrun was stopped ({self.outer_stop.reason})")
            steps, sync_ms = read_timings(self.directory, self.ranks)
            if sync_ms is not None:   # every rank is done: skip the workers' slow interpreter exit
                self.stop.request(signal.SIGTERM, "every rank wrote its timings")
                return None
            if time.monotonic() > self.deadline:
                return self._stop_trial(f"out of time ({self.allowance_s:.0f} s allowed)")
            reason = search.stop_early(steps, self.best_ms)
            if reason:
                return self._stop_trial(reason)


def run_trial(spec, environ, config, directory, allowance_s, best_ms, outer_stop):
    """Run the job once with `config`; returns its search.TrialResult."""
    directory = Path(directory)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    trial_spec = replace(spec, log_dir=str(directory / "logs"), tune=None, notes=())
    options = spec.tune
    env = {**environ, **trial_worker.trial_env(directory, config, options.steps, options.warmup)}
    started = time.monotonic()
    preflight = run_preflight(trial_spec, environ)
    stop = StopRequest()
    try:
        with open(directory / "fleetrun.log", "w") as err, open(os.devnull, "wb") as console:
            job = Job(trial_spec, preflight, env, LocalTransport(console), stop, err=err)
            ranks = [s.rank for s in job.slots if s.host == preflight.this_host]
            watcher = _Watcher(directory, ranks, stop, outer_stop, allowance_s, best_ms)
            watcher.start()
            code = job.run()
            watcher.done.set()
            watcher.join()
    finally:
        if preflight.reservation:
            preflight.reservation.release()
    steps, sync_ms = read_timings(directory, ranks)
    stopped = watcher.reason
    if code != 0 and stopped is None and sync_ms is None:
        stopped = f"failed with exit code {code} (see {directory / 'fleetrun.log'})"
    elif stopped is None and len(steps) < options.steps:
        stopped = f"the script ended after {len(steps)} timed steps of {options.steps}"
    return search.TrialResult(tuple(config), steps, sync_ms, time.monotonic() - started, stopped)


def check_tunable(spec):
    if spec.ssh or len(spec.ips) > 1:
        raise LaunchError("--tune runs the trials of a one-host job (its hosts' fleetruns would need the "
                          "trial settings too): tune on one host, or give --ips one host")
