"""Checks against this machine, run before any process starts.

Each failure is a LaunchError naming what is wrong and the fix: a job that cannot start
should say so at once, not hang in a rendezvous (Paddle silently gives a host that is not in
--ips rank offset 0, and a taken port aborts rank 0's store).
"""
import fcntl
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from typing import Optional

from fleetlite.errors import LaunchError
from fleetlite.launcher import ports
from fleetlite.launcher.plan import check_spec, job_port, pinned_port

SIOCGIFADDR = 0x8915
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"


@dataclass(frozen=True)
class Preflight:
    """What the checks found: which host of --ips this is, and rank 0's store port (reserved
    when the store runs here)."""
    this_host: str
    port: int
    reservation: Optional[ports.PortReservation] = None


def check_script(script):
    if not os.path.isfile(script):
        raise LaunchError(f"script not found: {script} (relative to {os.getcwd()})")


def local_addresses():
    """The IPv4 addresses of this machine's interfaces (read with an ioctl; no traffic)."""
    found = set()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                found.add(socket.inet_ntoa(fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)[20:24]))
            except OSError:  # an interface without an IPv4 address
                continue
    return found


def _is_loopback(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


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
    check_spec(spec)
    check_script(spec.script)
    this_host = find_this_host(spec.ips, spec.host, local_addresses(), socket.gethostname())
    if spec.ssh and this_host != spec.ips[0]:
        raise LaunchError(f"--ssh starts the other hosts from the first one: run it on {spec.ips[0]}, "
                          f"not on {this_host}")
    check_devices(spec.devices, visible_gpu_count(environ), environ)
    return store_port(spec, this_host)
