"""One job as this host sees it: start the workers, supervise them, report, maybe restart.

A restart replaces this host's whole group (all-or-nothing, like the first start) and tells
the workers their restart count (FLEETLITE_RESTART_COUNT); the script resumes from its own
checkpoint. Under --ssh the other hosts' fleetruns are started once: each restarts its own
group with the same budget, and a host whose fleetrun gives up fails the job.
"""
import os
import secrets
import sys
import time

from fleetlite.launcher.collective_stall import STALL_EXIT_CODE, StallWatch, format_stall
from fleetlite.launcher.console_table import format_table
from fleetlite.launcher.failure_report import diagnose, exit_code, format_report, read_end
from fleetlite.launcher.plan import CPU_MALLOC_TUNABLES, plan_workers
from fleetlite.launcher.preflight import GLOO_INTERFACE_ENV
from fleetlite.launcher.spec import follower_argv
from fleetlite.launcher.step_records import read_steps
from fleetlite.launcher.step_summary import SUMMARY_FILE, format_summary, summarize, write_summary
from fleetlite.launcher.supervisor import GRACE_S, stop_processes, watch
from fleetlite.launcher.timeline import chrome_trace, write_timeline
from fleetlite.launcher.transport import worker_command
from fleetlite.topology.env_contract import NODE_SECRET


def _tee_prefix(slot):
    return f"[rank {slot.rank}] " if slot.rank == 0 else None


class Job:
    def __init__(self, spec, preflight, environ, local, stop, remote=None, grace=GRACE_S, err=None, progress=None):
        self.spec, self.preflight = spec, preflight
        self.environ = {**environ, NODE_SECRET: secrets.token_hex(16)}     # kept by every restart
        self.local, self.remote, self.stop, self.grace = local, remote, stop, grace
        self.err = err or sys.stderr
        self.progress = progress    # a ProgressLine, shown while rank 0 runs on this host
        self.slots = self._plan(0)  # a bad plan fails here, before anything starts
        self._ended_remotes = set()

    def _say(self, *lines):
        if self.progress is not None:
            self.progress.clear()
        for line in lines:
            print(line, file=self.err, flush=True)

    def _plan(self, attempt):
        interface = self.preflight.gloo_interface
        environ = {GLOO_INTERFACE_ENV: interface, **self.environ} if interface else self.environ
        return plan_workers(self.spec, self.preflight.port, environ, attempt)

    def _start_other_hosts(self):
        if self.remote is None:
            return []
        remotes = []
        for host in self.spec.ips[1:]:
            ranks = [s.rank for s in self.slots if s.host == host]
            which = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"
            process = self.remote.start(host, follower_argv(self.spec, host, self.preflight.port), which)
            self._say(f"fleetrun: {which} on {host}: started its fleetrun over ssh "
                      f"(pid {process.pid}); it prints its own table and report")
            remotes.append(process)
        return remotes

    def _start_table(self, workers, attempt):
        spec, hosts = self.spec, len(self.spec.ips)
        title = (f"fleetrun: job {spec.job_id}: {len(self.slots)} workers on {hosts} "
                 f"host{'s' if hosts > 1 else ''}, rank 0's store at {self.slots[0].endpoint}, "
                 f"attempt {attempt + 1} of {spec.max_restarts + 1}")
        rows = [(w.slot.rank, w.slot.host, w.slot.device, w.slot.endpoint, w.pid,
                 w.slot.log_path + (" (tee'd below)" if w.teed else "")) for w in workers]
        lines = [title] + format_table(("rank", "host", "device", "endpoint", "pid", "log"), rows)
        if any(w.slot.device == "cpu" for w in workers):
            shown = ("OMP_NUM_THREADS", "KMP_BLOCKTIME", *CPU_MALLOC_TUNABLES)
            threads = {name: workers[0].slot.env[name] for name in shown if name in workers[0].slot.env}
            lines.append("  CPU workers: " + " ".join(f"{k}={v}" for k, v in threads.items()) +
                         " (fleetrun's defaults unless exported)")
        if self.preflight.gloo_interface:
            lines.append(f"  gloo binds {GLOO_INTERFACE_ENV}={self.preflight.gloo_interface}, the interface of "
                         f"{self.preflight.this_host} (fleetrun's choice unless exported)")
        self._say(*lines)

    def _attempt(self, attempt, remotes):
        """Run this host's group once; returns (exit code, whether to restart)."""
        slots = [s for s in self._plan(attempt) if s.host == self.preflight.this_host]
        command = worker_command(self.spec)
        workers = [self.local.start(slot, command, _tee_prefix(slot)) for slot in slots]
        self._start_table(workers, attempt)
        # every remote not seen ending yet: one whose ssh already failed is a failure of its host
        live = workers + [r for r in remotes if r not in self._ended_remotes]
        stall = StallWatch({slot.rank: slot.progress_file for slot in slots}, self.spec.collective_stall_timeout)
        shown = self.progress is not None and slots and slots[0].rank == 0
        if shown:
            self.progress.start(slots[0].progress_file, len(self.slots))
        ended = watch(live, self.stop, stalled=stall.check)
        if shown:
            self.progress.stop()
        failures = [e for e in ended if e.returncode != 0]
        restart = (bool(failures) and not self.stop.is_set() and attempt < self.spec.max_restarts
                   and all(e.process in workers for e in failures))
        done = {e.process for e in ended}
        self._ended_remotes.update(process for process in done if process in remotes)
        ended += stop_processes([p for p in live if p not in done and (p in workers or not restart)],
                                self.stop, self.grace)
        for worker in workers:
            worker.close()
        diagnosis = diagnose([read_end(e) for e in ended], blame_victims=not self.stop.is_set())
        if self.stop.is_set() and diagnosis.root is None:
            self._say(f"fleetrun: stopped by {self.stop.reason}")
        if stall.found:
            self._say(*format_stall(stall.found))
        self._say(*format_report(diagnosis, time.time()))
        self._report_steps(slots)
        if stall.found and diagnosis.root is None:
            return STALL_EXIT_CODE, False
        return exit_code(diagnosis, self.stop.signum), restart

    def _report_steps(self, slots):
        """The step summary of this host's ranks (printed, and as JSON in the log folder), and
        their timeline when --timeline asked for one."""
        records = [read_steps(slot.steps_file) for slot in slots]
        summary = summarize(records)
        if summary is not None:
            path = os.path.join(self.spec.log_dir, SUMMARY_FILE)
            write_summary(path, summary)
            self._say(*format_summary(summary, path))
        trace = chrome_trace(records, {slot.rank: slot.host for slot in slots}) if self.spec.timeline else None
        if trace is not None:
            write_timeline(self.spec.timeline, trace)
            self._say(f"fleetrun: timeline of this host's ranks in {self.spec.timeline} (open it in "
                      f"https://ui.perfetto.dev or chrome://tracing)")

    def run(self):
        remotes = self._start_other_hosts()
        try:
            for attempt in range(self.spec.max_restarts + 1):
                code, restart = self._attempt(attempt, remotes)
                if not restart:
                    break
                self._say(f"fleetrun: restarting this host's workers "
                          f"(restart {attempt + 1} of {self.spec.max_restarts})")
        finally:
            for remote in remotes:
                remote.close()
        outcome = "stopped" if self.stop.is_set() else "failed"
        self._say(f"fleetrun: {'job succeeded' if code == 0 else f'job {outcome}, exit code {code}'}")
        return code
