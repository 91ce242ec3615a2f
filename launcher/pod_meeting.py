"""`fleetrun` in a Kubernetes PaddleJob pod: the pods find each other at PADDLE_MASTER.

Kubeflow's training operator gives every pod PADDLE_MASTER (the first pod's service and a port),
PADDLE_NNODES (how many pods), PADDLE_JOB_ID, and the pod's own address in POD_IP, and runs the
same command in each; no pod knows the others' addresses. So, when --ips is not given and
PADDLE_NNODES is more than 1, the pod whose POD_IP is the master's address serves a meeting on the
master's port (rendezvous_store, Paddle's store protocol), every pod writes its address there, the
master's first, and each fleetrun then runs as a hand-started multi-host fleetrun with those
addresses as --ips and its POD_IP as --host. The meeting's port is the master's, so rank 0's store
takes the next one. Every wait is bounded by FLEETLITE_POD_MEETING_TIMEOUT seconds.
"""
import dataclasses
import socket
import time

from fleetlite.errors import LaunchError
from fleetlite.runtime.rendezvous_store import ANY_HOST, RendezvousStore, StoreClient
from fleetlite.topology.env_contract import NNODES

TIMEOUT_ENV = "FLEETLITE_POD_MEETING_TIMEOUT"
DEFAULT_TIMEOUT_S = 300
# keys of the meeting: each pod's index, its address under POD<index>, and two countdowns
JOINED, POD = "/pods/joined", "/pods/"
WRITTEN, ALL_WRITTEN, READ, ALL_READ = "/pods/written", "/pods/all-written", "/pods/read", "/pods/all-read"


def pod_count(environ):
    raw = environ.get(NNODES, "1")
    if not raw.isdigit() or int(raw) < 1:
        raise LaunchError(f"{NNODES}={raw!r} is not a number of pods: the PaddleJob sets it to its replicas")
    return int(raw)


def applies(spec, environ):
    """Whether this fleetrun is one pod of several that must find the others."""
    return not spec.ips_stated and pod_count(environ) > 1


def _timeout(environ):
    raw = environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S))
    if not raw.isdigit():
        raise LaunchError(f"{TIMEOUT_ENV}={raw!r} is not a whole number of seconds")
    return int(raw)


def _connect(address, port, deadline, master):
    while True:
        try:
            return StoreClient(address, port, timeout=max(1.0, deadline - time.monotonic()))
        except OSError as exc:
            if time.monotonic() > deadline:
                raise LaunchError(f"the pods' meeting at {master} did not answer ({exc.strerror or exc}): is the "
                                  f"first pod running, and does its service name resolve here?") from None
            time.sleep(0.2)


def meet(spec, environ):
    """The spec with the pods' addresses as --ips (the master's first) and this pod's as --host."""
    if not spec.master or not spec.host:
        raise LaunchError(f"{NNODES}={environ.get(NNODES)} pods but no --ips: each pod needs PADDLE_MASTER "
                          f"(the first pod's host:port) and POD_IP (its own address) to find the others")
    count, timeout = pod_count(environ), _timeout(environ)
    master_host, port = spec.master.rsplit(":", 1)
    address, port = socket.gethostbyname(master_host), int(port)
    deadline = time.monotonic() + timeout
    server = RendezvousStore(address, port, count, ANY_HOST) if spec.host == address else None
    store = _connect(address, port, deadline, spec.master)
    try:
        store.block(timeout)
        index = 0 if server else store.add(JOINED, 1)
        if index >= count:
            raise LaunchError(f"more pods than {NNODES}={count} met at {spec.master}: give every pod the same "
                              f"{NNODES}")
        store.set(f"{POD}{index}", spec.host.encode())
        if store.add(WRITTEN, 1) == count:
            store.set(ALL_WRITTEN, b"1")
        store.wait(ALL_WRITTEN)
        ips = tuple(store.get(f"{POD}{i}").decode() for i in range(count))
        if store.add(READ, 1) == count:
            store.set(ALL_READ, b"1")
        if server:
            store.wait(ALL_READ)
    except socket.timeout:
        raise LaunchError(f"not all {count} pods met at {spec.master} within {timeout} s ({TIMEOUT_ENV} sets "
                          f"the wait): is every pod of the PaddleJob running?") from None
    finally:
        store.close()
        if server:
            server.close()
    return dataclasses.replace(spec, ips=ips, ips_stated=True, master=f"{ips[0]}:{port + 1}")
