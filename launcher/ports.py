"""Which TCP ports this machine uses, and reserving one for a job's store.

Ports are read from /proc/net/tcp and tcp6, never probed with connect(): a connect() to a port
in the ephemeral range can connect to itself and then hold the very port it tested (seen once
in ~150 launches as a libuv abort in rank 0's store). A port counts as used when any socket on
any local address has it, except in TIME_WAIT: Paddle's store binds 0.0.0.0 with SO_REUSEADDR,
which those do not block (a job reuses its port back to back).

Two fleetruns starting at the same moment both see a port free, so the choice is made
exclusive with one lock file per port (flock: the kernel drops it when fleetrun exits, however
it exits).
"""
import fcntl
import os
import tempfile
import time

from fleetlite.errors import LaunchError

TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
TIME_WAIT, LISTEN = "06", "0A"
LOCK_DIR = os.path.join(tempfile.gettempdir(), "fleetlite-ports")
LAST_PORT_BELOW_EPHEMERAL = 32767


def parse_tcp_table(text):
    """[(local port, state hex)] for the rows of a /proc/net/tcp-format table."""
    rows = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3:
            rows.append((int(fields[1].rpartition(":")[2], 16), fields[3]))
    return rows


def _rows(tables):
    rows = []
    for path in tables:
        try:
            with open(path) as table:
                rows += parse_tcp_table(table.read())
        except FileNotFoundError:  # no IPv6 on this machine
            continue
    return rows


def ports_in_use(tables=TCP_TABLES):
    return {port for port, state in _rows(tables) if state != TIME_WAIT}


def is_listening(port, tables=TCP_TABLES):
    return any(p == port and state == LISTEN for p, state in _rows(tables))


def wait_until_listening(port, timeout, poll_interval=0.02, tables=TCP_TABLES):
    """True once something listens on `port`, False when `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not is_listening(port, tables):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_interval)
    return True


class PortReservation:
    """A held lock on one port; the job keeps it for its whole life."""

    def __init__(self, port, lock_file):
        self.port, self._lock_file = port, lock_file

    def release(self):
        self._lock_file.close()


def _try_lock(port, job_id, lock_dir):
    """(PortReservation, None), or (None, what the holder wrote) if another fleetrun holds it."""
    os.makedirs(lock_dir, exist_ok=True)
    lock_file = open(os.path.join(lock_dir, f"{port}.lock"), "a+")
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.seek(0)
        holder = lock_file.read().strip() or "another fleetrun"
        lock_file.close()
        return None, holder
    lock_file.truncate(0)
    lock_file.write(f"pid {os.getpid()} job {job_id}\n")
    lock_file.flush()
    return PortReservation(port, lock_file), None


def reserve_port(port, job_id, fix, lock_dir=LOCK_DIR, tables=TCP_TABLES):
    """Reserve a port the user chose; LaunchError naming the port, its user and `fix` if taken."""
    if port in ports_in_use(tables):
        raise LaunchError(f"port {port} (rank 0's store) is already in use on this host: {fix}")
    reservation, holder = _try_lock(port, job_id, lock_dir)
    if reservation is None:
        raise LaunchError(f"port {port} (rank 0's store) is reserved by a running fleetrun ({holder}): {fix}")
    return reservation


def reserve_free_port(first, job_id, lock_dir=LOCK_DIR, tables=TCP_TABLES,
                      last=LAST_PORT_BELOW_EPHEMERAL):
    """Reserve the first port from `first` that no socket uses and no other fleetrun holds."""
    used = ports_in_use(tables)
    for port in range(first, last + 1):
        if port not in used:
            reservation, _ = _try_lock(port, job_id, lock_dir)
            if reservation is not None:
                return reservation
    raise LaunchError(f"no free port in [{first}, {last}] on this host: pass --start_port")
