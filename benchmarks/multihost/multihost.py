"""Benchmark: fleetrun across hosts of a test cluster (namespace_cluster), faults and bytes between nodes.

    .venv/bin/python -m benchmarks.multihost.multihost [--json out.json] [--layers 256,1024,512,10]

Needs root, iproute2 and openssh (installed when missing). On 2 hosts x 2 processes:
- parity: `fleetrun --ssh` from node-a trains tests/launcher_scripts/train_linear.py; the largest
  relative difference of its final weights from one process's;
- host_kill_detect_s: every process of node-b SIGKILLed mid-run; seconds until fleetrun on node-a
  has stopped the job, having named node-b;
- partition_detect_s: node-b's link taken down mid-run; the same;
- resumed_equal: rank 2 (node-b) SIGKILLs itself at step 3, --max_restarts 1 resumes both hosts from
  the checkpoint; whether the final weights equal the uninterrupted run's (to 1e-5);
- orphans: fleetrun and worker processes left on any host after all of that;
- inter_node_bytes_per_step, intra_node_bytes_per_step: an MLP (--layers) trained with dense
  all-reduce, hierarchical (two-level) all-reduce, one-level top-k and hierarchical top-k at one
  density (--density): bytes the hosts
  sent each other (their links' counters) and within each host (their loopbacks), per step,
  median over rounds.
Where a cluster cannot be made, it says why and exits cleanly.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import namespace_cluster
from fleetlite.launcher.plan import worker_defaults
from fleetlite.topology.env_contract import worker_env
from fleetlite.topology.topology import Topology
from benchmarks.harness.runner import WorkerGroup, publish_skipped
from benchmarks.topk.topk_contenders import exchange

ROOT = Path(__file__).resolve().parents[2]
TRAIN = str(ROOT / "tests" / "launcher_scripts" / "train_linear.py")
HOSTS, PER_HOST, STEPS = 2, 2, 6
WORKER_PORT = 6170
JOB_TIMEOUT_S = 120


def clean_environment():
    return {name: value for name, value in os.environ.items() if not name.startswith(("PADDLE_", "FLEETLITE_"))}


def run_to_end(cluster, folder, *args):
    """fleetrun --ssh from node-a to its end: its exit code, output in folder/fleetrun.out."""
    with open(folder / "fleetrun.out", "w") as out:
        fleetrun = cluster.fleetrun(list(cluster.hosts), args, folder, env=clean_environment(), stdout=out,
                                    stderr=out)
    try:
        return fleetrun.wait(JOB_TIMEOUT_S)
    finally:
        fleetrun.kill()


def one_process(folder):
    result = subprocess.run([sys.executable, "-m", "fleetlite.launcher", "--job_id", "bench-one", TRAIN, "--steps",
                             str(STEPS), "--out", "w.npy"], cwd=folder, env=clean_environment(), capture_output=True,
                            timeout=JOB_TIMEOUT_S)
    if result.returncode:
        raise RuntimeError(f"one process failed: {result.stderr.decode()[-1000:]}")
    return np.load(folder / "w.npy")


def max_relative_difference(weights, oracle):
    return float(np.max(np.abs(weights - oracle) / np.maximum(np.abs(oracle), 1e-12)))


def time_fault(cluster, folder, fault, expected):
    """Seconds from `fault()`, caused once node-b trains, to the end of a long job's fleetrun, and
    whether its report has `expected`."""
    args = ["--nproc_per_node", str(PER_HOST), "--job_id", folder.name, TRAIN, "--steps", "1000",
            "--step_seconds", "0.1"]
    _, seconds, output = cluster.fault_during_job(
        list(cluster.hosts), args, folder, fault,
        (folder / "log" / f"workerlog.{PER_HOST * HOSTS - 1}@node-b", "step 2 "), env=clean_environment())
    return seconds, expected in output


def faults(cluster, folder):
    kill_s, kill_named = time_fault(cluster, folder / "host-kill", lambda: cluster.kill_host("node-b"),
                                    "the connection to node-b was lost")
    cluster.start_sshd("node-b")
    cut_s, cut_named = time_fault(cluster, folder / "partition", lambda: cluster.cut_link("node-b"),
                                  "the connection to node-b was lost")
    cluster.cut_link("node-b", up=True)
    return {"host_kill_detect_s": round(kill_s, 2), "host_kill_named": kill_named,
            "partition_detect_s": round(cut_s, 2), "partition_named": cut_named}


class ClusterWorkers(WorkerGroup):
    """A WorkerGroup whose ranks run in the cluster's hosts, `per_host` each, ranks contiguous per
    host, endpoints at the hosts' addresses (bound by gloo on eth0) from `port` on (groups that
    run side by side need ports `per_host` apart), in fleetrun's CPU environment."""

    def __init__(self, name, argv, cluster, per_host, timeout=600, port=WORKER_PORT):
        self.name, self.timeout, self.processes = name, timeout, []
        hosts = list(cluster.hosts.values())
        endpoints = [f"{host.address}:{port + local}" for host in hosts for local in range(per_host)]
        for rank, endpoint in enumerate(endpoints):
            topology = Topology(rank=rank, world_size=len(endpoints), local_rank=rank % per_host,
                                local_size=per_host, node_rank=rank // per_host, node_count=len(hosts),
                                endpoints=endpoints)
            env = {**clean_environment(), **worker_defaults(per_host, cpu=True), **worker_env(topology),
                   "OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2", "PYTHONUNBUFFERED": "1",
                   "GLOO_SOCKET_IFNAME": namespace_cluster.HOST_INTERFACE}
            self.processes.append(cluster.popen(hosts[rank // per_host].name, [sys.executable, "-m", *argv], cwd=ROOT,
                                                env=env, stdin=-1, stdout=-1, stderr=-3, text=True))
        self.ask({"op": "ready"})


def flat_and_two_level(density):
    """{key: topk_contenders name} of the exchanges compared across nodes: each flat one and its
    two-level form."""
    return {"dense": "dense", "hierarchical_allreduce": "hierarchical_allreduce", "topk": f"topk_{density:g}",
            "hierarchical_topk": f"hierarchical_topk_{density:g}"}


def traffic(cluster, layers, density, steps, rounds):
    """{exchange: bytes per step} between hosts and within hosts, median over `rounds` (after one
    warm-up round that absorbs the rendezvous)."""
    inter, intra = {}, {}
    for key, name in flat_and_two_level(density).items():
        group = ClusterWorkers(key, ["benchmarks.topk.topk_exchange_worker", exchange(name).name, layers, "32"], cluster,
                               PER_HOST)
        try:
            between, within = [], []
            for round_index in range(rounds + 1):
                sent = [cluster.sent_bytes(name) for name in cluster.hosts]
                looped = [cluster.loopback_bytes(name) for name in cluster.hosts]
                group.ask({"op": "measure", "reps": steps, "sync": False})
                if round_index:
                    between.append((sum(map(cluster.sent_bytes, cluster.hosts)) - sum(sent)) / steps)
                    within.append((sum(map(cluster.loopback_bytes, cluster.hosts)) - sum(looped)) / steps)
        finally:
            group.close()
        inter[key], intra[key] = round(statistics.median(between)), round(statistics.median(within))
    return inter, intra


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--layers", default="256,1024,512,10", help="the traffic MLP's widths")
    parser.add_argument("--density", type=float, default=0.01, help="one of topk_contenders' densities")
    parser.add_argument("--steps", type=int, default=4, help="training steps per traffic round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reason = namespace_cluster.unavailable()
    if reason:
        return publish_skipped(reason, args.json)
    report = {"hosts": HOSTS, "procs_per_host": PER_HOST, "transport": "ssh"}
    with tempfile.TemporaryDirectory(prefix="fleetlite-multihost-") as folder, \
            namespace_cluster.Cluster(HOSTS) as cluster:
        folder = Path(folder)
        for name in ("one", "parity", "host-kill", "partition", "restart"):
            (folder / name).mkdir()
        oracle = one_process(folder / "one")
        code = run_to_end(cluster, folder / "parity", "--nproc_per_node", str(PER_HOST), "--job_id", "bench-parity",
                          TRAIN, "--steps", str(STEPS), "--out", "w.npy")
        report["parity_max_rel"] = (max_relative_difference(np.load(folder / "parity" / "w.npy"), oracle)
                                    if code == 0 else None)
        report.update(faults(cluster, folder))
        code = run_to_end(cluster, folder / "restart", "--nproc_per_node", str(PER_HOST), "--max_restarts", "1",
                          "--job_id", "bench-restart", TRAIN, "--steps", str(STEPS), "--fail", "2:3:kill",
                          "--checkpoint", "ckpt.npz", "--out", "w.npy")
        report["resumed_equal"] = bool(code == 0 and max_relative_difference(
            np.load(folder / "restart" / "w.npy"), oracle) <= 1e-5)
        time.sleep(2)   # the remote fleetruns' last moments after their job ended
        report["orphans"] = sum(len(cluster.fleetlite_processes(name)) for name in cluster.hosts)
        report["inter_node_bytes_per_step"], report["intra_node_bytes_per_step"] = traffic(
            cluster, args.layers, args.density, args.steps, args.rounds)
    report.update(layers=args.layers, density=args.density)
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
