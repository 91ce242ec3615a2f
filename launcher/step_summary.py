"""The end-of-job summary: per rank, how long its steps took and where the time went, and the
rank that holds the others back, if one does.

Read from the ranks' step records (step_records). The first step is left out: it builds the
executor's plan. A data-parallel step ends for every rank at its last collective, so a rank that
arrives late makes every other rank wait inside its step: their steps grow, its own host time
(outside the step, before it) is what grew. Hence, per step, a rank's *waiting* is how much longer
its step ran than the fastest rank's, and the straggler is the rank whose host time before each
step exceeds the others' by a clear margin *and* is what the others spend waiting: a slow data
pipeline on one rank, not the ranks that wait for it. The summary covers this host's ranks (each
host's fleetrun reports its own).
"""
import json
import os
import statistics
from dataclasses import asdict, dataclass
from typing import List, Optional

from fleetlite.interprocess.private_paths import open_private_file
from fleetlite.launcher.console_table import format_table

SUMMARY_FILE = "step_summary.json"
STRAGGLER_MIN_S = 0.005        # host time this much above the others' (and...
STRAGGLER_MIN_SHARE = 0.10     # ...this share of a step cycle) before a rank is named
WAIT_EXPLAINED = 0.5           # the others must wait at least half of that excess


@dataclass(frozen=True)
class RankSteps:
    rank: int
    steps: int
    median_step_s: float
    p95_step_s: float
    waiting_share: float       # of the rank's time from its first timed step: waiting for others in steps
    outside_share: float       # ... and outside the steps (host code, input pipeline)
    mean_host_s: float
    mean_wait_s: float


@dataclass(frozen=True)
class StepSummary:
    ranks: List[RankSteps]
    straggler: Optional[int]
    reason: Optional[str]


def _percentile(values, share):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def summarize(records):
    """StepSummary of the step records (one per rank, None for a rank that left none)."""
    records = sorted((r for r in records if r is not None and len(r.step_s) > 1), key=lambda r: r.rank)
    if not records:
        return None
    common = min(len(r.step_s) for r in records)
    fastest = [min(r.step_s[i] for r in records) for i in range(1, common)]
    ranks = []
    for record in records:
        steps, host = record.step_s[1:common], record.host_s[1:common]
        waits = [step - least for step, least in zip(steps, fastest)]
        total = sum(steps) + sum(host) or 1.0
        ranks.append(RankSteps(record.rank, len(record.step_s), statistics.median(steps), _percentile(steps, 0.95),
                               sum(waits) / total, sum(host) / total, statistics.mean(host), statistics.mean(waits)))
    straggler, reason = _straggler(ranks)
    return StepSummary(ranks, straggler, reason)


def _straggler(ranks):
    if len(ranks) < 2:
        return None, None
    slowest = max(ranks, key=lambda r: r.mean_host_s)
    others = [r for r in ranks if r is not slowest]
    others_host = statistics.median(r.mean_host_s for r in others)
    others_wait = statistics.median(r.mean_wait_s for r in others)
    excess = slowest.mean_host_s - others_host
    cycle = statistics.median(r.median_step_s + r.mean_host_s for r in ranks)
    if excess < max(STRAGGLER_MIN_S, STRAGGLER_MIN_SHARE * cycle) or others_wait < WAIT_EXPLAINED * excess:
        return None, None
    return slowest.rank, (f"rank {slowest.rank} spends {_ms(slowest.mean_host_s)} outside the step before each one "
                          f"(the others {_ms(others_host)}), and the others wait {_ms(others_wait)} per step for it "
                          f"in the step's collectives: look at rank {slowest.rank}'s input pipeline and host code")


def _ms(seconds):
    return f"{seconds * 1000:.1f} ms"


def format_summary(summary, summary_path=None):
    """The lines fleetrun prints."""
    header = ("rank", "steps", "median step", "p95 step", "waiting", "outside the step")
    rows = [(r.rank, r.steps, _ms(r.median_step_s), _ms(r.p95_step_s), f"{r.waiting_share:.0%}",
             f"{r.outside_share:.0%}") for r in summary.ranks]
    where = f"; as JSON in {summary_path}" if summary_path else ""
    lines = [f"fleetrun: training steps per rank (the first left out: it builds the executor's plan; waiting: "
             f"in the step beyond the fastest rank's step{where}):"]
    lines += format_table(header, rows)
    if summary.straggler is not None:
        lines.append(f"fleetrun: straggler: {summary.reason}")
    return lines


def write_summary(path, summary):
    fd = open_private_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(summary), out, indent=1)
