"""Slurm's compressed lists, expanded in pure Python (no `scontrol show hostnames` needed).

A job's hosts come as a hostlist (`SLURM_JOB_NODELIST=node[0-3,7],gpu-a[01-02]`: ranges keep
their zero padding, several bracketed parts multiply) and its tasks per host as a repeat list
(`SLURM_STEP_TASKS_PER_NODE=2(x3),1`). fleetlite's rendezvous port under srun is derived from
the job and step ids, so every rank computes the same one with nothing exported by hand.
"""
import re

from fleetlite.errors import TopologyError

# Below fleetrun's job ports (20000..29999, launcher/plan.py) and Linux's ephemeral range (32768+).
SLURM_PORT_BASE, SLURM_PORT_SPAN = 10000, 10000
STEPS_PER_JOB = 16   # consecutive jobs' first steps get ports this far apart
_BRACKET = re.compile(r"\[([^\[\]]*)\]")
_REPEAT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _split_top_level(text):
    """`text` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0:
            raise TopologyError(f"Slurm hostlist {text!r} has a ']' without its '['")
        if char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    if depth:
        raise TopologyError(f"Slurm hostlist {text!r} has a '[' without its ']'")
    parts.append(text[start:])
    return [part for part in parts if part]


def _range_items(inside, hostlist):
    items = []
    for piece in inside.split(","):
        low, _, high = piece.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise TopologyError(f"Slurm hostlist {hostlist!r}: [{inside}] holds {piece!r}, not a "
                                f"number or a range like 0-3")
        high = high or low
        if int(high) < int(low):
            raise TopologyError(f"Slurm hostlist {hostlist!r}: range {piece} runs backwards")
        items += [str(number).zfill(len(low)) for number in range(int(low), int(high) + 1)]
    return items


def _expand_one(pattern, hostlist):
    match = _BRACKET.search(pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[:match.start()], pattern[match.end():]
    return [head + item + rest for item in _range_items(match.group(1), hostlist)
            for rest in _expand_one(tail, hostlist)]


def expand_hostlist(hostlist):
    """['node0', 'node1', ...] for a Slurm hostlist such as 'node[0-1,7],login'."""
    hosts = [host for pattern in _split_top_level(hostlist.strip()) for host in _expand_one(pattern, hostlist)]
    if not hosts:
        raise TopologyError(f"Slurm hostlist {hostlist!r} names no host")
    return hosts


def expand_tasks_per_node(text):
    """[2, 2, 2, 1] for Slurm's '2(x3),1'."""
    counts = []
    for part in text.split(","):
        match = _REPEAT.match(part.strip())
        if match is None:
            raise TopologyError(f"Slurm tasks per node {text!r}: {part!r} is not N or N(xM)")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def rendezvous_port(job_id, step_id=0):
    """rank 0's store port for a step of a Slurm job, the same on every rank."""
    return SLURM_PORT_BASE + (job_id * STEPS_PER_JOB + step_id) % SLURM_PORT_SPAN
