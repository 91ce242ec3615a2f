"""`plan_workers`: a LaunchSpec -> every worker of the job, as plain `WorkerSlot` values.

Pure: no process, socket or file is touched, so the whole table of a 4-host x 8-GPU job can
be checked in a unit test. Every host's fleetrun computes the same table from the same flags,
which is how hosts agree on ranks and endpoints without talking to each other.
"""
import ipaddress
import os
import zlib
from dataclasses import dataclass
from typing import Mapping

from fleetlite.topology import env_contract
from fleetlite.errors import LaunchError
from fleetlite.topology.topology import Topology

# Hand-launched multi-host jobs cannot agree on a free port, so their default port is derived
# from the job id: one per job id, below Linux's ephemeral range (32768+).
JOB_PORT_BASE, JOB_PORT_SPAN = 20000, 10000
# Allocations below 32 MiB come from the heap, and freed heap memory is kept for reuse (up to 4 GiB).
CPU_MALLOC_TUNABLES = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "4294967296"}


@dataclass(frozen=True)
class WorkerSlot:
    rank: int
    local_rank: int
    host: str
    device: str          # "cpu" or "gpu:<id>"
    endpoint: str
    log_path: str
    error_file: str
    progress_file: str
    steps_file: str
    env: Mapping[str, str]  # the worker's whole environment


def job_port(job_id):
    """The default store port of a job whose hosts cannot pick one together."""
    return JOB_PORT_BASE + zlib.crc32(job_id.encode()) % JOB_PORT_SPAN


def pinned_port(spec):
    """The store port the user fixed with --start_port or --master, or None."""
    master_port = int(spec.master.rpartition(":")[2]) if spec.master else None
    if master_port and spec.start_port and master_port != spec.start_port:
        raise LaunchError(f"--master {spec.master} and --start_port {spec.start_port} disagree on "
                          f"rank 0's store port: give one of them")
    return master_port or spec.start_port


def _same_host_key(host):
    """Spellings of one host compare equal: names ignore case and a trailing dot, addresses
    compare as addresses (::1 and 0::1)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower().rstrip(".")


def _check_hosts(spec):
    seen = {}
    for position, host in enumerate(spec.ips, 1):
        key = _same_host_key(host)
        if key in seen:
            first, at = seen[key]
            spelled = "" if host == first else f" (as {first} and {host})"
            raise LaunchError(f"--ips lists {first} twice (positions {at} and {position}){spelled}: "
                              f"list each host once; --nproc_per_node or --gpus sets its workers")
        seen[key] = (host, position)
    if spec.master and spec.master.rpartition(":")[0] != spec.ips[0]:
        raise LaunchError(f"--master {spec.master} is not on the first host of --ips ({spec.ips[0]}), "
                          f"which runs rank 0 and its store: list that host first in --ips")


def _devices(spec):
    """One entry per worker on a host: None for a CPU worker, else its GPU id."""
    if spec.devices is None:
        count = 1 if spec.nproc_per_node is None else spec.nproc_per_node
        if count < 1:
            raise LaunchError("--nproc_per_node 0: a host needs at least one worker")
        return [None] * count
    if not spec.devices:
        raise LaunchError("--gpus lists no device")
    bad = [d for d in spec.devices if d < 0]
    if bad:
        raise LaunchError(f"--gpus {','.join(map(str, spec.devices))}: device ids are >= 0, got {bad[0]}")
    repeated = sorted({d for d in spec.devices if spec.devices.count(d) > 1})
    if repeated:
        raise LaunchError(f"--gpus lists device {repeated[0]} more than once: one worker per device")
    if spec.nproc_per_node not in (None, len(spec.devices)):
        raise LaunchError(f"--nproc_per_node {spec.nproc_per_node} but --gpus lists "
                          f"{len(spec.devices)} devices: one worker per GPU, drop --nproc_per_node")
    return list(spec.devices)


def check_spec(spec):
    """The flag contradictions plan_workers would find, checked before anything touches the
    machine; returns each worker's device per host (None: CPU)."""
    _check_hosts(spec)
    return _devices(spec)


def worker_defaults(local_size, cpu):
    """Environment defaults; inherited values win over these (benchmarks of fleetlite's exchanges
    run their workers under them too, so they time what fleetrun runs).

    Paddle's C++ INFO lines (store and executor start-up) would flood every log, so only its
    warnings and errors are kept. On CPU, Paddle's OpenMP spins a core for 200 ms after each
    op unless told not to, competing with gloo; and workers sharing a host should not each
    start a thread per core (Paddle asks for OMP_NUM_THREADS=1 under data parallelism). glibc's
    malloc tunables keep the bucket buffers that fused gradient sync allocates every step on the
    heap, reused, instead of fresh page-faulting mmaps (docs/performance.md: about half the page
    faults, 6-8 % less sync time on CPU)."""
    defaults = {"GLOG_minloglevel": "1"}
    if cpu:
        defaults.update(KMP_BLOCKTIME="0", **CPU_MALLOC_TUNABLES)
        if local_size > 1:
            defaults["OMP_NUM_THREADS"] = "1"
    return defaults


def _log_path(spec, host, rank):
    name = f"workerlog.{rank}" if len(spec.ips) == 1 else f"workerlog.{rank}@{host}"
    return os.path.join(spec.log_dir, name)


def plan_workers(spec, port, environ, attempt=0):
    """Every worker of the job, in rank order (hosts in --ips order, devices in --gpus order).

    `port` is rank 0's store port; `environ` the environment the workers inherit (the contract's
    variables override it); `attempt` the restart count the workers are told."""
    devices = check_spec(spec)
    local_size = len(devices)
    if port + local_size - 1 > 65535:
        raise LaunchError(f"port {port} + {local_size} workers runs past 65535: pick a lower --start_port")
    endpoints = [f"{host}:{port + local}" for host in spec.ips for local in range(local_size)]
    records = os.path.join(spec.log_dir, ".fleetlite")
    slots = []
    for node, host in enumerate(spec.ips):
        for local, device_id in enumerate(devices):
            rank = node * local_size + local
            topology = Topology(rank=rank, world_size=len(endpoints), local_rank=local,
                                local_size=local_size, node_rank=node, node_count=len(spec.ips),
                                endpoints=endpoints, device="cpu" if device_id is None else "gpu",
                                device_id=device_id)
            error_file = os.path.join(records, f"rank{rank}.error.json")
            progress_file = os.path.join(records, f"rank{rank}.progress")
            steps_file = os.path.join(records, f"rank{rank}.steps.json")
            defaults = worker_defaults(local_size, cpu=device_id is None)
            contract = env_contract.worker_env(topology, spec.job_id, attempt, error_file, progress_file, steps_file,
                                               step_events=spec.timeline is not None)
            slots.append(WorkerSlot(
                rank=rank, local_rank=local, host=host,
                device="cpu" if device_id is None else f"gpu:{device_id}",
                endpoint=endpoints[rank], log_path=_log_path(spec, host, rank),
                error_file=error_file, progress_file=progress_file, steps_file=steps_file,
                env={**defaults, **environ, **contract}))
    return slots
