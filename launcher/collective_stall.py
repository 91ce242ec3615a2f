"""Ranks stuck in different collectives, found from their progress records and said once.

A rank in fleet.util.all_reduce and another in fleet.util.barrier (or in the same call, but
its 3rd against its 2nd) never meet: gloo would end the job only after its fixed 30 s, with a
C++ traceback that names neither call. Each worker's progress record says which fleet-level
collective it waits in (fleetlite.collective_waits); when ranks of this host have each waited
longer than the stall deadline in different ones, fleetrun stops the job and says where each
waits. Ranks on other hosts are their own fleetrun's to watch.
"""
import time
from dataclasses import dataclass
from typing import Tuple

from fleetlite.launcher.worker_records import CollectiveWait, read_progress

DEFAULT_STALL_TIMEOUT_S = 10.0   # well below gloo's fixed 30 s
STALL_EXIT_CODE = 1


@dataclass(frozen=True)
class Stall:
    waits: Tuple[Tuple[int, CollectiveWait], ...]   # (rank, where it waits), by rank
    seconds: float                                   # how long they have all been waiting


def find_stall(waits, now, deadline):
    """The Stall when ranks that have waited at least `deadline` seconds (`waits`: {rank:
    CollectiveWait or None}) wait in different collectives; else None."""
    long_waits = {rank: wait for rank, wait in waits.items() if wait is not None and now - wait.since >= deadline}
    if len({(wait.kind, wait.sequence) for wait in long_waits.values()}) < 2:
        return None
    return Stall(tuple(sorted(long_waits.items())), now - max(wait.since for wait in long_waits.values()))


def _waits_in(rank, wait):
    return f"rank {rank} waits in {wait.kind} (called from {wait.where}, its fleet collective #{wait.sequence})"


def format_stall(stall):
    """The report's headline: where each rank waits, and the fix."""
    *first, last = [_waits_in(rank, wait) for rank, wait in stall.waits]
    return [f"fleetrun: root cause: {', '.join(first)} while {last}, for {stall.seconds:.0f} s: the ranks "
            f"called different collectives; call the same collectives in the same order on every rank "
            f"(fleetrun stopped the job after its stall deadline, --collective_stall_timeout)"]


class StallWatch:
    """`check()` reads the ranks' progress records; `found` is the Stall once there is one.
    A deadline of 0 never finds one."""

    def __init__(self, progress_files, deadline, clock=time.time):
        self.progress_files, self.deadline, self.clock = progress_files, deadline, clock
        self.found = None

    def check(self):
        if self.deadline > 0 and self.found is None:
            progress = {rank: read_progress(path) for rank, path in self.progress_files.items()}
            self.found = find_stall({rank: p and p.collective for rank, p in progress.items()},
                                    self.clock(), self.deadline)
        return self.found
