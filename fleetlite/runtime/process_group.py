"""Bring up the job's default process group (ring 0) with deadlines, and the extra NCCL rings.

Why not `paddle.distributed.init_parallel_env()`: its rendezvous store waits without a usable
deadline (measured on 3.3.1: a rank whose master is missing, or a master whose workers are
missing, still waits after minutes). Here the same pieces are assembled with bounds:
- a non-master rank first polls the master endpoint with plain TCP connects, and fails with
  an error naming the endpoint when the deadline passes (Paddle's store client would retry
  silently, every 3 s, for much longer);
- rank 0 serves the store itself (rendezvous_store: Paddle's protocol on the master's address
  only, closed to new connections once every rank is in; Paddle's own server binds 0.0.0.0
  for the whole job) and waits for the ranks with the same deadline, so it fails naming them;
  every rank, rank 0 included, talks to it with Paddle's store client;
- the process group is then registered exactly as Paddle's own init does, so static programs
  find ring 0 and `paddle.distributed` calls work.
A script that called `paddle.distributed.init_parallel_env()` first already has that group, on
a store at the master port: `bring_up` adopts both (a second store there would abort rank 0).
`init_parallel_env()` after `bring_up` finds the group and returns it, as in Paddle's Fleet.
Paddle creates process groups in dynamic mode; `bring_up` switches to it and back.

`fleet.init` in static mode only `defer`s the rendezvous: as in Paddle, which connects when the
startup program runs, building, compiling and inspecting programs needs no live job (Paddle's
own meta-optimizer tests pose as rank 1 of 2 and never run). The first call that needs the other
ranks `connect`s, with the same deadline, and a failure names that call.
"""
import contextlib
import hashlib
import ipaddress
import os
import socket
import time

import paddle
import paddle.distributed.collective as paddle_collective
from paddle.base import core
from paddle.distributed import parallel_helper
from paddle.distributed.communication.group import Group, _add_new_group
from paddle.distributed.parallel import _set_expected_place

from fleetlite.errors import TopologyError
from fleetlite.interprocess import tcp_ports
from fleetlite.interprocess.network_interfaces import GLOO_INTERFACE_ENV, interface_towards
from fleetlite.runtime import rank_watch, rendezvous_store, subgroups
from fleetlite.topology.env_contract import worker_env

TIMEOUT_ENV = "FLEETLITE_INIT_TIMEOUT"
DEFAULT_TIMEOUT = 120
GROUP_NAME = "_default_pg"   # the name Paddle gives its default group

_store = None
_server = None   # rank 0's RendezvousStore
_watch = None    # this rank's RankWatch, for jobs no fleetrun supervises
ENDPOINT_PREFIX = "/fleetlite/endpoint/"
_deferred = None   # the (topology, timeout) fleet.init left for the first call that needs peers
_exchanged_endpoints = None   # every rank's own endpoint, when the launcher did not say them (Open MPI)


def init_timeout(environ=os.environ):
    raw = environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT))
    try:
        return max(1, int(raw))
    except ValueError:
        raise TopologyError(f"{TIMEOUT_ENV}={raw!r} is not a whole number of seconds") from None


def bring_up(topology, timeout):
    """Create the default process group for `topology` (nothing for a world of 1)."""
    global _store
    if topology.world_size == 1 or _store is not None:
        return
    existing = paddle_collective._get_group_map_by_name().get(GROUP_NAME)
    if existing is not None:
        _store = _adopt(existing, topology)
        subgroups.create_pending(_store)
        return
    watched = rank_watch.wanted(os.environ)   # before the lines below make it look like fleetrun's
    for name, value in worker_env(topology).items():   # Paddle's C++ side reads these
        if name.startswith(("PADDLE_", "FLAGS_")):
            os.environ.setdefault(name, value)
    host, port = topology.master.rsplit(":", 1)
    if topology.rank != 0:
        wait_for_endpoint(host, int(port), timeout, topology.rank)
    interface, own_address = interface_towards(host)
    if interface:   # fleetrun sets it for its workers; under srun or mpirun each rank binds its own
        os.environ.setdefault(GLOO_INTERFACE_ENV, interface)
    with dynamic_mode():
        _store = _rendezvous(host, int(port), topology, timeout, watched)
        if topology.endpoints_from_store:
            _exchange_endpoints(_store, topology, own_address)
        _register_default_group(_store, topology)
    subgroups.create_pending(_store)
    if _watch is not None:
        _watch.start()


def _exchange_endpoints(store, topology, own_address):
    """Every rank's own endpoint (its address on the route to the master, the master's port plus
    its local rank), through the store; rank 0's stays the master."""
    global _exchanged_endpoints
    port = int(topology.master.rsplit(":", 1)[1])
    mine = topology.master if topology.rank == 0 else f"{own_address}:{port + topology.local_rank}"
    store.set(f"{ENDPOINT_PREFIX}{topology.rank}", mine.encode())
    _exchanged_endpoints = tuple(store.get(f"{ENDPOINT_PREFIX}{rank}").decode()
                                 for rank in range(topology.world_size))


def endpoints(topology):
    """Every rank's endpoint: the topology's, or, where the launcher did not say them, the ones the
    ranks exchanged (meeting the other ranks first if fleet.init deferred it)."""
    if not topology.endpoints_from_store:
        return topology.endpoints
    connect("fleet.worker_endpoints()")
    return _exchanged_endpoints or topology.endpoints


def defer(topology, timeout):
    """Meet the other ranks of `topology` later, at the first `connect` (nothing for a world of 1)."""
    global _deferred
    if topology.world_size > 1 and _store is None:
        _deferred = (topology, timeout)


def deferred():
    """Whether a rendezvous waits for the first call that needs the other ranks."""
    return _deferred is not None


def connect(needed_by):
    """Bring up the deferred rendezvous now, if there is one; `needed_by` (the call that needs the
    other ranks) is named in the error when they do not come within the deadline."""
    global _deferred
    if _deferred is None:
        return
    (topology, timeout), _deferred = _deferred, None
    try:
        bring_up(topology, timeout)
    except TopologyError as exc:
        raise TopologyError(f"{needed_by} met the other ranks (fleet.init in static mode waits for the "
                            f"first call that needs them) and failed: {exc}") from exc


@contextlib.contextmanager
def dynamic_mode():
    """Run the body in Paddle's dynamic mode, then restore static mode if it was on: process
    groups are created, and eager collectives run, in dynamic mode only."""
    static = not paddle.in_dynamic_mode()
    if static:
        paddle.disable_static()
    try:
        yield
    finally:
        if static:
            paddle.enable_static()


def is_up():
    """Whether this process has a process group (a job of more than one rank after bring_up)."""
    return _store is not None


def store():
    """The job's rendezvous store (None before bring_up)."""
    return _store


def create_subgroups(communicators, rank):
    """The gloo sub-group communicators [(key, members)] a compiled program uses: now if the job
    is up, else right after the deferred rendezvous (runtime.subgroups)."""
    subgroups.expect(communicators, rank)
    if _store is not None:
        subgroups.create_pending(_store)


def wait_for_endpoint(host, port, timeout, rank):
    """Return once rank 0's store listens on host:port; TopologyError after `timeout` seconds.

    On this machine the kernel's TCP table is read instead of connecting: a connect() to a port
    in the ephemeral range can connect to itself and then hold the very port rank 0 needs."""
    if ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
        if tcp_ports.wait_until_listening(port, timeout):
            return
        _unreachable(host, port, timeout, rank, "nothing listens there")
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                _unreachable(host, port, timeout, rank, exc)
            time.sleep(0.1)


def _unreachable(host, port, timeout, rank, why):
    raise TopologyError(
        f"rank {rank} could not reach the master endpoint {host}:{port} (rank 0's rendezvous "
        f"store) within {timeout} s ({why}): is rank 0 running, and is {host} reachable? "
        f"({TIMEOUT_ENV} sets the wait)")


def _rendezvous(host, port, topology, timeout, watched=False):
    """Paddle's store client on every rank; rank 0 first serves the store (rendezvous_store)
    on the master's address only, and waits until every rank has connected."""
    global _server, _watch
    if topology.rank == 0:
        _server = _serve_store(host, port, topology)
    if watched:   # before the store stops listening
        _watch = rank_watch.RankWatch(socket.gethostbyname(host), port, topology.rank, socket.gethostname(), host)
    try:
        store = core.TCPStore(host, port, False, topology.world_size, timeout)
    except Exception as exc:  # Paddle raises SystemError with its own text
        raise _rendezvous_failed(host, port, topology, timeout) from exc
    if topology.rank == 0 and not _server.wait_for_ranks(timeout):
        raise _rendezvous_failed(host, port, topology, timeout)
    return store


def _rendezvous_failed(host, port, topology, timeout):
    if topology.rank == 0:
        refused = (f" (refused {', '.join(sorted(_server.refused))}: not hosts of the job)"
                   if _server.refused else "")
        what = (f"rank 0 hosts the rendezvous store at {host}:{port}, but not all "
                f"{topology.world_size - 1} other ranks connected within {timeout} s{refused}")
    else:
        what = f"rank {topology.rank} reached {host}:{port} but the rendezvous did not finish within {timeout} s"
    return TopologyError(f"{what}: a rank is missing or was started late ({TIMEOUT_ENV} sets the wait)")


def _serve_store(host, port, topology):
    address = socket.gethostbyname(host)
    if ipaddress.ip_address(address).is_loopback:
        peers = None
    elif topology.endpoints_from_store:
        peers = rendezvous_store.ANY_HOST
    else:
        peers = {socket.gethostbyname(endpoint.rsplit(":", 1)[0]) for endpoint in topology.endpoints}
    try:
        return rendezvous_store.RendezvousStore(address, port, topology.world_size, peers)
    except OSError as exc:
        raise TopologyError(f"rank 0 could not listen on {address}:{port} for the rendezvous store "
                            f"({exc.strerror}): stop what uses the port, or pick another") from None


def _adopt(group, topology):
    """The store of the default group `paddle.distributed.init_parallel_env()` made, once it
    is checked to be this topology's."""
    if (group.rank, group.nranks) != (topology.rank, topology.world_size):
        raise TopologyError(
            f"paddle.distributed.init_parallel_env() made this process rank {group.rank} of {group.nranks}, "
            f"but fleet.init's topology says rank {topology.rank} of {topology.world_size}: start the job "
            f"with one launcher (fleetrun) so both read the same environment")
    return paddle_collective._default_store


def _register_default_group(store, topology):
    backend = topology.backend
    if backend == "nccl":
        core.CommContextManager.set_device_id(topology.device_id)
        place = core.CUDAPlace(topology.device_id)
    else:
        place = core.CPUPlace()
    _set_expected_place(place)
    paddle_collective._set_default_store(store)
    paddle_collective._set_default_backend(backend)
    process_group = paddle_collective._new_process_group_impl(
        backend, store, topology.rank, topology.world_size, GROUP_NAME, pg_options=None)
    group = Group(topology.rank, 0, list(range(topology.world_size)), pg=process_group, name=GROUP_NAME)
    paddle_collective._set_group_map_by_name(GROUP_NAME, group)
    paddle_collective._set_group_map(0, group)
    paddle_collective._set_group_map_backend(group, backend)
    _add_new_group(group)
    parallel_helper._set_parallel_ctx(True)


def world_group():
    """The default group: every rank of the job (after bring_up)."""
    return paddle_collective._get_default_group()


def barrier(needed_by="a barrier"):
    """Wait until every rank gets here (works in static mode, unlike dist.barrier)."""
    connect(needed_by)
    if _store is not None:
        paddle_collective._get_default_group().process_group.barrier().wait()


def create_nccl_rings(rings, topology):
    """One NCCL communicator per ring static programs use: ring 0 (the world; the startup
    broadcast needs it, and the process group only creates it lazily, on its first eager
    collective) and every ring in `rings` (the report's, with this rank's members).

    Every rank creates every ring, in id order, with its own group's members; the key that
    pairs the members of one group through the store hashes their endpoints and the ring id.
    Creating a ring that exists is a no-op in Paddle.
    """
    world = {"ring": 0, "members": list(range(topology.world_size))}
    for ring in [world] + [r for r in rings if r["ring"] != 0]:
        members = ring["members"]
        endpoints = "".join(topology.endpoints[r] for r in members) + f"ring_id:{ring['ring']}"
        core.CommContextManager.create_nccl_comm_context(
            _store, str(ring["ring"]), members.index(topology.rank), len(members),
            hashlib.md5(endpoints.encode()).hexdigest())
