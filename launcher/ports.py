"""Reserving a TCP port for a job's store.

Which ports are used is read from the kernel's tables (fleetlite.interprocess.tcp_ports), never
probed with connect(). Two fleetruns starting at the same moment both see a port free, so the
choice is made exclusive with one lock file per port (flock: the kernel drops it when fleetrun
exits, however it exits).

The locks live in this user's private folder (`<tmp>/fleetlite-<uid>/ports`, 0700, owner
checked), not in a shared one: another user can neither plant a symlink where a lock is
written nor hold every lock. They coordinate this user's fleetruns; another user's job is seen
through the kernel's tables once it listens.
"""
import fcntl
import os

from fleetlite.errors import LaunchError
from fleetlite.interprocess.private_paths import open_private_file, trusted_folder, user_temp_folder
from fleetlite.interprocess.tcp_ports import TCP_TABLES, ports_in_use

LAST_PORT_BELOW_EPHEMERAL = 32767


def lock_folder(chosen=None):
    """The folder of port locks (`chosen`, or this user's), created and checked: LaunchError
    naming it when another user could change it."""
    return trusted_folder(chosen or os.path.join(user_temp_folder(LaunchError), "ports"), LaunchError)


class PortReservation:
    """A held lock on one port; the job keeps it for its whole life."""

    def __init__(self, port, lock_file):
        self.port, self._lock_file = port, lock_file

    def release(self):
        self._lock_file.close()


def _try_lock(port, job_id, lock_dir):
    """(PortReservation, None), or (None, what the holder wrote) if another fleetrun holds it."""
    fd = open_private_file(os.path.join(lock_dir, f"{port}.lock"), os.O_RDWR | os.O_CREAT, LaunchError)
    lock_file = os.fdopen(fd, "r+")
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.seek(0)
        holder = lock_file.read().strip() or "another fleetrun"
        lock_file.close()
        return None, holder
    lock_file.seek(0)
    lock_file.truncate()
    lock_file.write(f"pid {os.getpid()} job {job_id}\n")
    lock_file.flush()
    return PortReservation(port, lock_file), None


def reserve_port(port, job_id, fix, lock_dir=None, tables=TCP_TABLES):
    """Reserve a port the user chose; LaunchError naming the port, its user and `fix` if taken."""
    if port in ports_in_use(tables):
        raise LaunchError(f"port {port} (rank 0's store) is already in use on this host: {fix}")
    reservation, holder = _try_lock(port, job_id, lock_folder(lock_dir))
    if reservation is None:
        raise LaunchError(f"port {port} (rank 0's store) is reserved by a running fleetrun ({holder}): {fix}")
    return reservation


def reserve_free_port(first, job_id, lock_dir=None, tables=TCP_TABLES,
                      last=LAST_PORT_BELOW_EPHEMERAL):
    """Reserve the first port from `first` that no socket uses and no other fleetrun holds."""
    used, lock_dir = ports_in_use(tables), lock_folder(lock_dir)
    for port in range(first, last + 1):
        if port not in used:
            reservation, _ = _try_lock(port, job_id, lock_dir)
            if reservation is not None:
                return reservation
    raise LaunchError(f"no free port in [{first}, {last}] on this host: pass --start_port")
