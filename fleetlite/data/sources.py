"""Where sample files come from: a folder (`FileSource`), or the same folder read as if over
a slow network file system (`ThrottledSource`, for tests and benchmarks: there is no NFS here).

A source reads a sample file by its name relative to the source's root; the disk cache
(disk_cache.py) keeps local copies under the same names.
"""
import os
import time

from fleetlite.errors import DataError


def checked_name(name):
    """`name` as a relative path inside a root, refusing anything that leaves it."""
    name = os.path.normpath(os.fspath(name))
    if os.path.isabs(name) or name == ".." or name.startswith(".." + os.sep):
        raise DataError(f"sample file {name!r} is not inside the source folder: list files relative to it")
    return name


class FileSource:
    """Sample files under `root`, read whole."""

    def __init__(self, root):
        self.root = os.path.abspath(os.fspath(root))
        if not os.path.isdir(self.root):
            raise DataError(f"source folder {self.root} does not exist")

    def path(self, name):
        return os.path.join(self.root, checked_name(name))

    def read(self, name):
        with open(self.path(name), "rb") as handle:
            return handle.read()

    def __repr__(self):
        return f"{type(self).__name__}({self.root!r})"


class ThrottledSource(FileSource):
    """A slow-storage simulator: every read of `n` bytes takes at least
    `latency_ms + n / bandwidth_MBps` (per reading process, like one client of a network file
    system), however fast the local disk is."""

    def __init__(self, root, bandwidth_MBps=50.0, latency_ms=5.0):
        super().__init__(root)
        if bandwidth_MBps <= 0 or latency_ms < 0:
            raise DataError(f"bandwidth_MBps={bandwidth_MBps}, latency_ms={latency_ms}: the bandwidth must be "
                            f"positive and the latency not negative")
        self.bandwidth, self.latency = bandwidth_MBps * 1e6, latency_ms / 1e3
        self.bytes_read = 0          # by this process, over its lifetime

    def read(self, name):
        start = time.perf_counter()
        data = super().read(name)
        self.bytes_read += len(data)
        remaining = self.latency + len(data) / self.bandwidth - (time.perf_counter() - start)
        if remaining > 0:
            time.sleep(remaining)
        return data
