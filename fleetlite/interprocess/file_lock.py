"""An exclusive lock on a file, waited for with a deadline: how the processes of one node (the
ranks of a job) take turns at making something once, such as a disk-cache copy or a compiled
kernel. flock is released by the kernel when its holder dies, so a killed process never blocks
the others. Lock files are made 0600 and never opened through a symlink (they live in folders
fleetlite.interprocess.private_paths checked)."""
import fcntl
import os
import time


class FileLock:
    """`with FileLock(path, timeout, activity, error):` holds the lock on `path`; waiting longer
    than `timeout` seconds raises `error` naming the `activity` the holder is busy with."""

    def __init__(self, path, timeout, activity, error):
        self.path, self.timeout, self.activity, self.error = path, timeout, activity, error

    def __enter__(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise self.error(f"waited {self.timeout:.0f} s for another process to {self.activity} "
                                     f"({self.path} is locked)") from None
                time.sleep(0.002)

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
