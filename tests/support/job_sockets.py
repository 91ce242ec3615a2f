"""The TCP sockets a running job's processes hold, read from /proc (no ss needed)."""
import ipaddress
import os

LISTEN = "0A"


def descendants(root):
    """`root` and every process below it."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:      # it exited while we looked
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _socket_inodes(pid):
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:              # it exited, or the fd closed, while we looked
        pass
    return inodes


def _address(hex_address):
    host, port = hex_address.split(":")
    raw = b"".join(bytes.fromhex(host[i:i + 8])[::-1] for i in range(0, len(host), 8))
    address = ipaddress.ip_address(raw)
    return getattr(address, "ipv4_mapped", None) or address, int(port, 16)


def tcp_sockets(pids):
    """{(state, local address, local port)} of the TCP sockets processes `pids` hold, all in
    the network namespace of the first (state: 'listen' or 'connected')."""
    pids = list(pids)
    inodes = set().union(*(_socket_inodes(pid) for pid in pids))
    found = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pids[0]}/net/{table}") as rows:
                lines = rows.read().splitlines()[1:]
        except (FileNotFoundError, ProcessLookupError, IndexError):   # no IPv6; it exited; no pids
            continue
        for line in lines:
            fields = line.split()
            if fields[9] in inodes:
                found.add(("listen" if fields[3] == LISTEN else "connected", *_address(fields[1])))
    return found
