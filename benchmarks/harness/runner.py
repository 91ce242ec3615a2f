"""Interleaved, paired benchmark driver (protocol: shared/notes/perf_anchors.md §7).

Every contender is a long-lived group of worker processes (one per rank) that waits on stdin, so
idle contenders use no CPU. Each round asks every contender once, in turn (A B C A B C ...), so
machine drift cancels out in the ratios; a sample is the slowest rank's time. Only ratios taken
within one run are meaningful on a shared 2-core machine.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fleetlite.topology.env_contract import worker_env
from fleetlite.topology.topology import Topology

ROOT = Path(__file__).resolve().parents[2]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class WorkerGroup:
    """`world` processes of one contender, driven by one JSON line per request; `argv` is the worker's
    module (benchmarks.<topic>.<name>) and its arguments, run from the repository root."""

    def __init__(self, name, argv, world=2, timeout=600, extra_env=None, wrap=None):
        """`extra_env`: more variables for the workers (read at process start, e.g. glibc tunables);
        `wrap`: a function of a worker's command line returning the one to run (e.g. in a namespace)."""
        self.name, self.timeout = name, timeout
        port = free_port()
        self.processes = []
        for rank in range(world):
            topology = Topology.grid(world, rank=rank, base_port=port)
            env = {**os.environ, **worker_env(topology), "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(world), "GLOG_minloglevel": "2",
                   "PYTHONUNBUFFERED": "1", **(extra_env or {})}
            command = [sys.executable, "-m", *argv]
            self.processes.append(subprocess.Popen(
                wrap(command) if wrap else command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, env=env, text=True, cwd=ROOT))
        self.ask({"op": "ready"})

    def ask(self, request):
        """Send a request to every rank; return their replies (one JSON object each)."""
        line = json.dumps(request) + "\n"
        for process in self.processes:
            process.stdin.write(line)
            process.stdin.flush()
        replies = []
        deadline = time.monotonic() + self.timeout
        for rank, process in enumerate(self.processes):
            reply = _read_reply(process, deadline)
            if reply is None:
                self.close()
                raise RuntimeError(f"contender {self.name}: rank {rank} died or timed out on {request}")
            replies.append(reply)
        return replies

    def sample(self, reps):
        """One sample per repetition: the slowest rank's time in ms."""
        replies = self.ask({"op": "measure", "reps": reps})
        return [max(times) for times in zip(*(r["ms"] for r in replies))]

    def close(self):
        for process in self.processes:
            if process.poll() is None:
                try:
                    process.stdin.write(json.dumps({"op": "quit"}) + "\n")
                    process.stdin.flush()
                except OSError:
                    pass
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def _read_reply(process, deadline):
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            return None
        if line.startswith("{"):
            return json.loads(line)
    return None


def run_interleaved(groups, rounds, warmup, reps):
    """{name: [median of each round]} over `rounds` rounds after `warmup` discarded ones."""
    medians = {g.name: [] for g in groups}
    for round_index in range(warmup + rounds):
        for group in groups:
            value = statistics.median(group.sample(reps))
            if round_index >= warmup:
                medians[group.name].append(value)
    return medians


def protocol_parser(description):
    """The arguments every benchmark driver shares (rounds, warm-up, samples, JSON output)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3, help="samples per contender per round")
    parser.add_argument("--json", default=None)
    return parser


def measure(contenders, args, facts=None):
    """Start every contender [(name, worker argv, world[, extra env])], run the interleaved rounds,
    stop them. Returns ({name: [round medians]}, the foreign CPU share during the rounds). Given a
    dict `facts`, it also gets {name: [each rank's answer to "info"]} (see worker_loop.serve)."""
    groups = []
    try:
        for name, argv, world, *env in contenders:
            groups.append(WorkerGroup(name, argv, world=world, extra_env=env[0] if env else None))
        load = LoadCheck([p.pid for g in groups for p in g.processes])
        medians = run_interleaved(groups, args.rounds, args.warmup, args.reps)
        foreign = load.foreign_share()
        if facts is not None:
            facts.update({group.name: [reply["info"] for reply in group.ask({"op": "info"})] for group in groups})
        return medians, foreign
    finally:
        for group in groups:
            group.close()


def publish(rows, ratios, foreign, medians, json_path):
    """Print the ratios line; write everything, raw round medians included, as JSON if asked."""
    print("\nratios:", json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in ratios.items()}))
    if json_path:
        with open(json_path, "w") as out:
            json.dump({"rows": rows, "ratios": ratios, "foreign_load": foreign, "rounds": medians}, out, indent=1)


def publish_skipped(reason, json_path):
    """Say why a benchmark cannot run on this machine (and write {"skipped": reason} if asked)."""
    print(f"skipped: {reason}")
    if json_path:
        with open(json_path, "w") as out:
            json.dump({"skipped": reason}, out, indent=1)


class LoadCheck:
    """Share of the machine's CPU used by anything but this driver and the given workers."""

    def __init__(self, pids):
        self.pids = pids
        self.start_total, self.start_busy = _proc_stat()
        self.start_own = self._own()

    def _own(self):
        times = os.times()
        return times.user + times.system + sum(_process_cpu_seconds(pid) for pid in self.pids)

    def foreign_share(self):
        total, busy = _proc_stat()
        foreign = (busy - self.start_busy) / os.sysconf("SC_CLK_TCK") - (self._own() - self.start_own)
        wall = (total - self.start_total) / os.sysconf("SC_CLK_TCK")
        return max(0.0, foreign) / wall if wall else 0.0


def _proc_stat():
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields), sum(fields) - idle


def _process_cpu_seconds(pid):
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(values):
    return {"median_ms": statistics.median(values), "min_ms": min(values), "max_ms": max(values)}


def print_table(title, rows, columns):
    """rows: list of dicts; columns: [(key, header, format)]."""
    print(f"\n{title}")
    headers = [h for _, h, _ in columns]
    cells = [[fmt.format(row[k]) if row.get(k) is not None else "-" for k, _, fmt in columns] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths)))
