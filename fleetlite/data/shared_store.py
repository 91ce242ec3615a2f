"""The memory level of the sample cache: decoded samples of one node in one shared-memory
file, keyed by sample index, so the ranks of a node hold one copy between them.

The file (on /dev/shm, a tmpfs: its pages are memory) holds a table with one entry per
sample index and an arena of at most `capacity` bytes. A sample is written once and never
evicted: the first samples to arrive fill the arena and stay, the rest are served from the
level below. Under repeated full scans (training epochs) that gives a hit rate equal to the
resident fraction, where an LRU cache smaller than the data misses every time.

Writers reserve arena space under a file lock (the only lock, taken once per written sample),
copy the sample in, then mark the entry ready; readers use only ready entries, so there is no
torn entry to read. A reservation records its writer's pid: a process killed while writing
leaves a reserved entry that the next writer of that sample reclaims, under the same lock, once
the pid no longer exists (reusing the reserved space when the sample fits in it). The ranks of
a node must therefore share a pid namespace, as fleetrun's children do; a dead writer whose
pid was reused by a live process keeps its slot until that process exits.

The file lives in this user's private folder (`/dev/shm/fleetlite-<uid>`, 0700) and is opened
without following symlinks, only if this user owns it and nobody else can write it. What it
holds is still checked before it is used: the header against the store's settings, each entry's
bounds against the arena, each array's head against the entry, and only dtypes without objects
or structure are mapped (an object array would hand numpy pointers read from the file). A file that fails is
refused with a DataError naming its path, never read past its end or mapped as objects.
"""
import fcntl
import mmap
import os
import struct
import threading
import time

import numpy as np

from fleetlite.errors import DataError
from fleetlite.interprocess.private_paths import open_private_file, user_temp_folder
from fleetlite.interprocess.process_liveness import process_exists

MAGIC = b"FLSTORE2"
HEADER = struct.Struct("<8sQQQ")           # magic, entries, capacity (arena bytes), bytes used
ENTRY = np.dtype([("state", "<u8"), ("offset", "<u8"), ("nbytes", "<u8"), ("writer", "<u8")])   # writer: a pid
EMPTY, RESERVED, READY = 0, 1, 2
ALIGN = 64                                   # each sample starts on a cache line
ARRAY_HEAD = struct.Struct("<8sQ")          # dtype string, number of dimensions
TABLE_START = ALIGN
SHARED_MEMORY = "/dev/shm"                   # a tmpfs every user may write (mode 1777)
MAPPED_KINDS = "biufcmMSU"                   # numbers, times, bytes, text: no objects, no structures


def default_folder():
    """This user's private folder on /dev/shm (made 0700, or checked), or None without /dev/shm."""
    return user_temp_folder(DataError, shared=SHARED_MEMORY) if os.path.isdir(SHARED_MEMORY) else None


def mapped_dtype(text):
    """The numpy dtype a stored array head names, if it is one this store maps; else None."""
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError, SyntaxError):
        return None
    return dtype if dtype.kind in MAPPED_KINDS and not dtype.hasobject else None


def _round_up(n, to):
    return -(-n // to) * to


def encoded_size(arrays):
    return sum(_round_up(ARRAY_HEAD.size + 8 * a.ndim, 16) + _round_up(a.nbytes, 16) for a in arrays) + 16


class SharedSampleStore:
    """A bounded, no-evict map {sample index: tuple of numpy arrays} shared by the processes
    that open the same `path` (every rank of a node). `capacity` bounds the arena in bytes; the
    table adds 32 bytes per entry."""

    def __init__(self, path, entries, capacity, timeout=60.0):
        self.path, self.entries, self.capacity = path, int(entries), int(capacity)
        self.arena_start = _round_up(TABLE_START + self.entries * ENTRY.itemsize, ALIGN)
        size = self.arena_start + self.capacity
        try:
            fd = open_private_file(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, DataError)
            created = True
        except FileExistsError:
            fd = open_private_file(path, os.O_RDWR, DataError)
            created = False
        self._fd = fd
        if created:
            os.ftruncate(fd, size)           # sparse: pages are allocated as samples arrive
            os.pwrite(fd, HEADER.pack(b"\0" * 8, self.entries, self.capacity, 0), 0)
            os.pwrite(fd, MAGIC, 0)          # last: the store is complete once it carries its magic
        else:
            self._wait_for_creator(timeout)
            if os.fstat(fd).st_size < size:
                self._refuse(f"is {os.fstat(fd).st_size} bytes, shorter than its header's {size}")
        self._map = mmap.mmap(fd, size)
        self.table = np.ndarray(self.entries, ENTRY, buffer=self._map, offset=TABLE_START)
        self._thread_lock = threading.Lock()

    def _wait_for_creator(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            head = os.pread(self._fd, HEADER.size, 0)
            if len(head) == HEADER.size and head[:8] == MAGIC:
                break
            if head[:7] == MAGIC[:7] and head[:8] != MAGIC:
                raise DataError(f"the shared sample store {self.path} was made by another fleetlite version "
                                f"({head[:8].decode(errors='replace')}, this one reads {MAGIC.decode()}): remove it")
            if time.monotonic() > deadline:
                raise DataError(f"the shared sample store {self.path} was never completed by the process "
                                f"that created it ({timeout:.0f} s); remove the file and restart")
            time.sleep(0.01)
        _, entries, capacity, used = HEADER.unpack(head)
        if used > capacity:
            self._refuse(f"says {used} bytes of its {capacity}-byte arena are used")
        if (entries, capacity) != (self.entries, self.capacity):
            raise DataError(f"the shared sample store {self.path} holds {entries} entries in {capacity} bytes, "
                            f"not {self.entries} in {self.capacity}: another job or setting uses the same name; "
                            f"remove the file or change cache_dir / memory_cache_MB")

    def _refuse(self, what):
        os.close(self._fd)
        raise DataError(f"the shared sample store {self.path} {what}: it is damaged or not fleetlite's; remove it")

    @property
    def used(self):
        return HEADER.unpack_from(self._map, 0)[3]

    def __contains__(self, index):
        return int(self.table["state"][index]) == READY

    def get(self, index):
        """The arrays of sample `index` (read-only views into shared memory), or None; DataError
        naming the file when the entry does not hold what this store writes."""
        state, offset, nbytes, _ = (int(field) for field in self.table[index])
        if state != READY:
            return None
        if nbytes < 16 or offset + nbytes > self.capacity:
            self._damaged(index, f"its bytes [{offset}, {offset + nbytes}) are not inside the "
                                 f"{self.capacity}-byte arena")
        view = memoryview(self._map)[self.arena_start + offset:self.arena_start + offset + nbytes]
        (count,) = struct.unpack_from("<Q", view, 0)
        position, arrays = 16, []
        for _ in range(count):
            if position + ARRAY_HEAD.size > nbytes:
                self._damaged(index, f"it lists {count} arrays that do not fit in its {nbytes} bytes")
            name, ndim = ARRAY_HEAD.unpack_from(view, position)
            dtype = mapped_dtype(name.rstrip(b"\0").decode("ascii", "replace"))
            if dtype is None or position + _round_up(ARRAY_HEAD.size + 8 * ndim, 16) > nbytes:
                self._damaged(index, f"an array head names dtype {name!r} with {ndim} dimensions "
                                     f"(object and structured dtypes are never mapped)")
            shape = struct.unpack_from(f"<{ndim}Q", view, position + ARRAY_HEAD.size)
            position += _round_up(ARRAY_HEAD.size + 8 * ndim, 16)
            size = dtype.itemsize * int(np.prod(shape, dtype=object))
            if position + size > nbytes:
                self._damaged(index, f"an array of shape {shape} runs past the entry's {nbytes} bytes")
            array = np.ndarray(shape, dtype, buffer=view, offset=position)
            array.flags.writeable = False
            arrays.append(array)
            position += _round_up(array.nbytes, 16)
        return tuple(arrays)

    def _damaged(self, index, why):
        raise DataError(f"the shared sample store {self.path} holds a damaged entry for sample {index}: {why}; "
                        f"remove the file")

    def put(self, index, arrays):
        """Store sample `index` if it is not there (or only reserved by a writer that died) and
        fits; True when this call stored it."""
        arrays = [np.ascontiguousarray(a) for a in arrays]
        unmapped = [str(a.dtype) for a in arrays if mapped_dtype(a.dtype.str) is None]
        if unmapped:
            raise DataError(f"sample {index} holds arrays of dtype {unmapped[0]}, which the memory cache cannot "
                            f"share: decode samples to arrays of numbers (object and structured dtypes are "
                            f"never mapped)")
        nbytes = _round_up(encoded_size(arrays), ALIGN)
        with self._thread_lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                start = self._reserve(index, nbytes)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        if start is None:
            return False
        self._write(self.arena_start + start, arrays)
        self.table["state"][index] = READY
        return True

    def _reserve(self, index, nbytes):
        """Arena offset reserved for sample `index` by this process, or None (held lock)."""
        state, offset, reserved, writer = (int(field) for field in self.table[index])
        if state == READY or (state == RESERVED and process_exists(writer)):
            return None
        if state == RESERVED and nbytes <= reserved:       # a dead writer's space, reused
            self.table[index] = (RESERVED, offset, reserved, os.getpid())
            return offset
        used = self.used
        if used + nbytes > self.capacity:
            return None
        struct.pack_into("<Q", self._map, 24, used + nbytes)
        self.table[index] = (RESERVED, used, nbytes, os.getpid())
        return used

    def _write(self, start, arrays):
        struct.pack_into("<Q", self._map, start, len(arrays))
        position = start + 16
        for array in arrays:
            struct.pack_into(f"<8sQ{array.ndim}Q", self._map, position, array.dtype.str.encode(), array.ndim,
                             *array.shape)
            position += _round_up(ARRAY_HEAD.size + 8 * array.ndim, 16)
            target = np.ndarray(array.nbytes, np.uint8, buffer=self._map, offset=position)
            target[:] = array.reshape(-1).view(np.uint8)
            position += _round_up(array.nbytes, 16)

    def mapped_memory(self):
        """(Rss, Pss) in bytes of this process's mapping of the store: resident pages, and
        resident pages divided by the number of processes mapping each (summed over the ranks
        of a node, Pss is the node's one copy)."""
        sizes, inside = {"Rss:": 0, "Pss:": 0}, False
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                fields = line.split()
                if "-" in fields[0] and len(fields) >= 5:      # a mapping's first line ends with its path
                    inside = fields[-1] == self.path
                elif inside and fields[0] in sizes:
                    sizes[fields[0]] += int(fields[1]) * 1024
        return sizes["Rss:"], sizes["Pss:"]

    def allocated_bytes(self):
        """Bytes of memory the store's file holds (its pages are allocated as samples arrive)."""
        return os.stat(self.path).st_blocks * 512

    def close(self):
        """Unmap (views returned by get must not be used after this)."""
        self.table = None
        try:
            self._map.close()
        except BufferError:     # views of it are still alive somewhere: the mapping goes with them
            pass
        os.close(self._fd)

    def unlink(self):
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
