"""Checks against this machine, run before any process starts.

Each failure is a LaunchError naming what is wrong and the fix: a job that cannot start
should say so at once, not hang in a rendezvous (Paddle silently gives a host that is not in
--ips rank offset 0, and a taken port aborts rank 0's store).
"""
import dataclasses
import ipaddress
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Optional

from fleetlite.errors import LaunchError
from fleetlite.interprocess.network_interfaces import GLOO_INTERFACE_ENV, interface_addresses
from fleetlite.launcher import ports
from fleetlite.launcher.plan import check_spec, job_port, pinned_port

LOOPBACK = "127.0.0.1"
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"
HOST_LOOKUP_TIMEOUT_S = 5.0
_HOSTNAME_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


@dataclass(frozen=True)
class Preflight:
    """What the checks found: which host of --ips this is, and rank 0's store port (reserved
    when the store runs here)."""
    this_host: str
    port: int
    reservation: Optional[ports.PortReservation] = None
    gloo_interface: Optional[str] = None   # GLOO_SOCKET_IFNAME for this host's workers


def check_script(script):
    if os.path.isdir(script):
        raise LaunchError(f"script {script} is a directory, not a file: pass the training script "
                          f"(the .py file) to run")
    if not os.path.isfile(script):
        raise LaunchError(f"script not found: {script} (relative to {os.getcwd()})")


IPV4_ONLY = ("is an IPv6 address: fleetrun builds IPv4 endpoints (host:port) only; list the host by its "
             "IPv4 address, or by a name that resolves to one")


def _host_syntax_problem(host):
    """Why `host` is neither an IPv4 address nor a hostname (RFC 1123), or None. IPv6 is refused:
    endpoints are written host:port, which an IPv6 address would need brackets for, end to end."""
    address = _address(host)
    if address:
        return IPV4_ONLY if address.version == 6 else None
    if re.fullmatch(r"[0-9.]+", host):   # resolvers would read "10.0.0" as 10.0.0.0
        return "is not a valid IPv4 address: write four numbers 0-255 without leading zeros, like 10.0.0.1"
    if re.fullmatch(r"[^:]+:[0-9]*", host):
        return "has a port: --ips lists hosts only; rank 0's store port is --start_port"
    if ":" in host:
        return IPV4_ONLY.replace("is an", "looks like an", 1)
    if any(c.isspace() for c in host):
        return "contains a space: separate hosts with commas only"
    labels = (host[:-1] if host.endswith(".") else host).split(".")
    if len(host) > 253 or not all(_HOSTNAME_LABEL.fullmatch(label) for label in labels):
        return ("is not a valid hostname: use letters, digits and '-' between dots "
                "(at most 63 each, not starting or ending with '-')")
    if labels[-1].isdigit():
        return "is not a valid hostname: its last part is all digits"
    return None


def _look_up(name):
    socket.getaddrinfo(name, None, family=socket.AF_INET, type=socket.SOCK_STREAM)   # IPv4 only, as endpoints


def _lookup_failures(names, lookup, timeout):
    """{name: why it did not resolve} for the names that did not, all looked up at once in
    daemon threads; a lookup still running at the deadline counts as failed (and is left behind,
    as getaddrinfo cannot be cancelled)."""
    failures = {}

    def resolve(name):
        try:
            lookup(name)
        except OSError as exc:
            failures[name] = exc.strerror or str(exc)

    threads = {name: threading.Thread(target=resolve, args=(name,), name=f"look up {name}", daemon=True)
               for name in names}
    for thread in threads.values():
        thread.start()
    deadline = time.monotonic() + timeout
    for name, thread in threads.items():
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            failures.setdefault(name, f"no answer within {timeout:g} s")
    return {name: failures[name] for name in names if name in failures}


def check_hosts(hosts, flag="--ips", lookup=_look_up, timeout=HOST_LOOKUP_TIMEOUT_S):
    """Every host must be an IPv4 address or a hostname that resolves to one, before anything
    starts: a malformed entry would otherwise be handed to the workers as an endpoint.

    Addresses are taken as written and names are only looked up (no traffic goes to any host),
    all within `timeout` seconds."""
    for position, host in enumerate(hosts, 1):
        problem = _host_syntax_problem(host)
        if problem:
            raise LaunchError(f"{flag}: host {position} {host!r} {problem}")
    failures = _lookup_failures([host for host in hosts if not _address(host)], lookup, timeout)
    if failures:
        name, why = next(iter(failures.items()))
        raise LaunchError(f"{flag}: host {name!r} does not resolve ({why}): fix the name, or list the "
                          f"host by its IP address")


def prepare_log_dir(log_dir):
    """Create --log_dir now, so a path that cannot hold the logs is refused before any worker
    starts (not as a traceback when the first one is spawned)."""
    flag = f"--log_dir {log_dir}"
    in_the_way = _first_non_folder(log_dir)
    if in_the_way:
        raise LaunchError(f"{flag}: {in_the_way} is a file, not a folder: move it away, or pass "
                          f"another --log_dir")
    try:
        os.makedirs(log_dir, exist_ok=True)
    except OSError as exc:
        raise LaunchError(f"{flag}: cannot create {exc.filename} ({exc.strerror}): pass a folder you "
                          f"can write to as --log_dir") from None
    if not os.access(log_dir, os.W_OK | os.X_OK):
        raise LaunchError(f"{flag}: the folder is not writable (permission denied): pass a folder you "
                          f"can write to as --log_dir")


def _first_non_folder(path):
    """The first existing part of `path` that is not a folder (a file, a broken link), or None."""
    parts = os.path.normpath(path).split(os.sep)
    for end in range(1, len(parts) + 1):
        prefix = os.sep.join(parts[:end]) or os.sep
        if os.path.lexists(prefix) and not os.path.isdir(prefix):
            return prefix
    return None


def _ipv4_of(name):
    """The first IPv4 address `name` resolves to here, or None."""
    try:
        return socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (OSError, IndexError):
        return None


def gloo_interface(ips, this_host, environ, interfaces, hostname, resolve=_ipv4_of):
    """The interface this host's workers bind gloo to (their GLOO_SOCKET_IFNAME), or None to
    leave gloo's own choice.

    Left alone, gloo binds whatever this machine's hostname resolves to, and on hosts where
    that is 127.0.1.1 (Debian's /etc/hosts) the other hosts cannot reach the workers. So on a
    job across hosts each host's workers bind the interface that holds its own --ips address;
    when there is none, a hostname that resolves to a loopback address is refused here, with
    the fix. Hosts that are all loopback addresses (one machine) bind the loopback interface,
    so no worker listens where the network reaches it. An exported GLOO_SOCKET_IFNAME is
    left as it is."""
    if GLOO_INTERFACE_ENV in environ:
        return None
    if all(_is_loopback(host) for host in ips):
        return interfaces.get(LOOPBACK, "lo")
    address = this_host if _address(this_host) else resolve(this_host)
    if address == this_host and _address(address).is_loopback:
        raise LaunchError(f"--ips: this host is listed as {this_host}, a loopback address: the other hosts "
                          f"cannot reach its workers there; list it by an address they reach")
    if address and _address(address).is_loopback:
        raise LaunchError(f"--ips: this host, {this_host}, resolves to {address} here, a loopback address "
                          f"(Debian's /etc/hosts maps a machine's own name to 127.0.1.1): the other hosts "
                          f"cannot reach its workers there; list this host in --ips by an address they "
                          f"reach, or map {this_host} to that address in this host's /etc/hosts")
    if address in interfaces:
        return interfaces[address]
    own = resolve(hostname)
    if own and _address(own).is_loopback:
        raise LaunchError(f"this host's name {hostname!r} resolves to {own}, a loopback address, and "
                          f"{this_host} is not an address of its interfaces: gloo would bind its workers "
                          f"to {own}, where the other hosts cannot reach them; map {hostname} to the "
                          f"address the other hosts reach in /etc/hosts, or set GLOO_SOCKET_IFNAME to that "
                          f"interface in this host's environment")
    return None


def _address(host):
    """`host` as an IPv4/IPv6 address, or None when it is not one."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _is_loopback(host):
    address = _address(host)
    return address.is_loopback if address else host == "localhost"


def find_this_host(ips, host, addresses, hostname):
    """Which entry of --ips this machine is: --host if given, else the one entry that is an
    address of this machine (any of 127.0.0.0/8 counts), or its hostname."""
    listed = ",".join(ips)
    if host is not None:
        if host not in ips:
            raise LaunchError(f"--host {host} is not in --ips {listed}: add it, or fix --host")
        return host
    mine = [ip for ip in ips if ip == hostname or ip in addresses or _is_loopback(ip)]
    if not mine:
        known = ", ".join(sorted(addresses | {hostname}))
        raise LaunchError(f"this host ({known}) is not in --ips {listed}: run fleetrun on each "
                          f"listed host, or pass --host if this host is listed under another name")
    if len(mine) > 1:
        raise LaunchError(f"several hosts in --ips are this machine ({', '.join(mine)}): pass "
                          f"--host to say which one this fleetrun is")
    return mine[0]


def visible_gpu_count(environ):
    """How many GPUs a worker can select: CUDA_VISIBLE_DEVICES' entries when it is set (ids
    are relative to it), else the GPUs the NVIDIA driver lists."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return len(os.listdir(NVIDIA_GPUS)) if os.path.isdir(NVIDIA_GPUS) else 0


def check_devices(devices, visible, environ):
    if devices is None:
        return
    scope = (f" (ids are relative to CUDA_VISIBLE_DEVICES={environ['CUDA_VISIBLE_DEVICES']})"
             if "CUDA_VISIBLE_DEVICES" in environ else "")
    if visible == 0:
        raise LaunchError(f"--gpus {','.join(map(str, devices))}: this host has no visible GPU"
                          f"{scope}; for CPU workers use --nproc_per_node instead")
    missing = [d for d in devices if d >= visible]
    if missing:
        raise LaunchError(f"--gpus asks for device {missing[0]} but this host has {visible} visible "
                          f"GPUs, ids 0..{visible - 1}{scope}")


def store_port(spec, this_host):
    """Rank 0's store port, reserved when the store runs on this host.

    A port the user pinned must be free. Otherwise a single host, or the first host of an
    --ssh job (which tells the others), takes the first free port from the job's default;
    hosts started by hand cannot agree on a free port, so they all use the job's default."""
    pinned = pinned_port(spec)
    if this_host != spec.ips[0]:
        return Preflight(this_host, pinned or job_port(spec.job_id))
    if pinned:
        reservation = ports.reserve_port(pinned, spec.job_id,
                                         fix="stop what uses it, or pass another --start_port")
    elif len(spec.ips) == 1 or spec.ssh:
        reservation = ports.reserve_free_port(job_port(spec.job_id), spec.job_id)
    else:
        reservation = ports.reserve_port(
            job_port(spec.job_id), spec.job_id,
            fix="pass the same free --start_port to every host's fleetrun, or another --job_id")
    return Preflight(this_host, reservation.port, reservation)


def run_preflight(spec, environ):
    """Every check, in the order that costs least; the log folder is created last, after the
    store port is reserved, so a refused job leaves nothing behind."""
    check_spec(spec)
    check_script(spec.script)
    check_hosts(spec.ips)
    interfaces, hostname = interface_addresses(), socket.gethostname()
    this_host = find_this_host(spec.ips, spec.host, set(interfaces), hostname)
    if spec.ssh and this_host != spec.ips[0]:
        raise LaunchError(f"--ssh starts the other hosts from the first one: run it on {spec.ips[0]}, "
                          f"not on {this_host}")
    interface = gloo_interface(spec.ips, this_host, environ, interfaces, hostname)
    check_devices(spec.devices, visible_gpu_count(environ), environ)
    preflight = dataclasses.replace(store_port(spec, this_host), gloo_interface=interface)
    try:
        prepare_log_dir(spec.log_dir)
    except LaunchError:
        if preflight.reservation:
            preflight.reservation.release()
        raise
    return preflight
