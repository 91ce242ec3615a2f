"""This machine's IPv4 interfaces, and the one a process reaches another host through.

fleetrun picks the interface its workers bind gloo to from these; a worker started by another
launcher (srun, mpirun) picks its own, the one on the route to rank 0's store, so each host's
gloo listens on the address the other hosts reach (not on what the hostname resolves to).
"""
import fcntl
import socket
import struct

SIOCGIFADDR = 0x8915
GLOO_INTERFACE_ENV = "GLOO_SOCKET_IFNAME"


def interface_addresses():
    """{IPv4 address: interface} of this machine's interfaces (read with an ioctl; no traffic)."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                found[socket.inet_ntoa(fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)[20:24])] = name
            except OSError:  # an interface without an IPv4 address
                continue
    return found


def address_towards(host):
    """This machine's IPv4 address on the route to `host` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(host), 9))
        return probe.getsockname()[0]


def interface_towards(host):
    """(interface, address) this machine reaches `host` through; interface None when no
    interface holds that address."""
    address = address_towards(host)
    return interface_addresses().get(address), address
