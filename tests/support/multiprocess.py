"""Run N real worker processes as one job on loopback, bounded, and collect their results.

Each rank gets the environment fleetrun would give it (env_contract.worker_env on a
Topology.grid with a free master port; nodes are 127.0.0.1, 127.0.0.2, ...) plus
FLEETLITE_RESULT, the path where the worker writes its JSON result. The first rank that
fails, or the deadline, ends the whole job: every process group is killed and the error
names the rank with the tail of its log. `run_jobs` runs several jobs side by side, and
`run_with_oracles` each N-rank job next to its 1-process oracle (alone, an oracle leaves a core
idle).
"""
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fleetlite.topology.env_contract import worker_env
from fleetlite.topology.topology import Topology

RESULT_ENV = "FLEETLITE_RESULT"
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "launcher_scripts")
FLEETRUN = [sys.executable, "-m", "fleetlite.launcher"]
QUIET_CPU = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "GLOG_minloglevel": "2",
             "PYTHONWARNINGS": "ignore"}


class JobFailed(AssertionError):
    """A worker exited non-zero or the job ran past its deadline."""


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def clean_environment():
    """This process's environment without any launcher's variables (for starting a launcher)."""
    return {name: value for name, value in os.environ.items()
            if not name.startswith(("PADDLE_", "FLEETLITE_", "POD_IP"))}


def without_root_override():
    """A command prefix under which root meets permission bits as any user does (no
    CAP_DAC_OVERRIDE), so tests of read-only files and folders run under root too, as in CI."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


def fleetrun(args, cwd, timeout=90, prefix=()):
    """fleetrun to its end, its output captured; `prefix` runs it under another command."""
    return subprocess.run([*prefix, *FLEETRUN, *args], cwd=cwd, env=clean_environment(), capture_output=True,
                          text=True, timeout=timeout)


def run_job(script, world_size, node_count=1, args=(), timeout=120, extra_env=None, ranks=None, hosts=None,
            wrap=None):
    """Run `script` as the ranks `ranks` (default: all) of a job of `world_size`; returns their
    JSON results in that order. `hosts` (one address per node) replaces the nodes' 127.0.0.x in
    the endpoints, and `wrap(node, argv)` gives the command that runs a rank of that node (e.g.
    in a host of a test cluster)."""
    port = free_port()
    ranks = list(range(world_size)) if ranks is None else list(ranks)
    with tempfile.TemporaryDirectory(prefix="fleetlite-job-") as folder:
        folder = Path(folder)
        processes = {}
        try:
            for rank in ranks:
                topology = Topology.grid(world_size, node_count, rank=rank, base_port=port)
                if hosts:
                    topology = dataclasses.replace(topology, endpoints=[
                        f"{hosts[index // topology.local_size]}:{endpoint.rpartition(':')[2]}"
                        for index, endpoint in enumerate(topology.endpoints)])
                command = [sys.executable, str(script), *map(str, args)]
                env = {**os.environ, **QUIET_CPU, **worker_env(topology), **(extra_env or {}),
                       RESULT_ENV: str(folder / f"result.{rank}.json")}
                log = open(folder / f"log.{rank}", "w")
                processes[rank] = subprocess.Popen(wrap(topology.node_rank, command) if wrap else command, env=env,
                                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                log.close()
            _wait(processes, folder, timeout)
            return [json.loads((folder / f"result.{rank}.json").read_text()) for rank in ranks]
        finally:
            for process in processes.values():
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


def run_jobs(*jobs):
    """The results of several jobs (each a dict of run_job's arguments) run at once, in the order
    given; each job keeps its own deadline, and the first job that failed is raised once all
    have ended."""
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(run_job, **job) for job in jobs]
    return [future.result() for future in futures]


def run_with_oracles(script, worlds, args, timeout):
    """{world: (its 1-process oracle's result, [each rank's result])} for `worlds` ({world size: node
    count}), every job and every oracle side by side; `args(world)` gives a job and its oracle
    their arguments."""
    jobs = []
    for world, nodes in worlds.items():
        arguments = args(world)
        jobs += [dict(script=script, world_size=1, args=arguments, timeout=timeout),
                 dict(script=script, world_size=world, node_count=nodes, args=arguments, timeout=timeout)]
    results = iter(run_jobs(*jobs))
    return {world: (next(results)[0], next(results)) for world in worlds}


def _wait(processes, folder, timeout):
    deadline = time.monotonic() + timeout
    while True:
        codes = {rank: process.poll() for rank, process in processes.items()}
        failed = [rank for rank, code in codes.items() if code not in (None, 0)]
        if failed:
            rank = failed[0]
            raise JobFailed(f"rank {rank} exited with {codes[rank]}:\n{_tail(folder, rank)}")
        if all(code == 0 for code in codes.values()):
            return
        if time.monotonic() > deadline:
            running = [rank for rank, code in codes.items() if code is None]
            raise JobFailed(f"ranks {running} still running after {timeout} s:\n{_tail(folder, running[0])}")
        time.sleep(0.05)


def _tail(folder, rank, lines=30):
    text = (folder / f"log.{rank}").read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


def write_result(result):
    """Called by a worker: hand its JSON-able result back to run_job."""
    Path(os.environ[RESULT_ENV]).write_text(json.dumps(result))
