"""A dataset of sample files read through the cache levels: source → disk → memory.

`samples[i]` looks in the node's memory store for the decoded sample i; on a miss it reads the
file's bytes through the disk cache (copying them from the source on first touch), decodes them
and offers the result to the memory store, which keeps it if it fits. The random part of the
preprocessing (`augment`) runs after the cache with a generator per (seed, epoch, i), so the
cache never changes what is fed. Hits and misses of every level are counted per epoch.
"""
import atexit
import contextlib
import functools
import hashlib
import os
from collections import Counter

import numpy as np

from fleetlite.data import running_job as job
from fleetlite.data.disk_cache import (DEFAULT_CACHE_DIR, DiskCache, cache_dir_errors, cache_folder_path,
                                      make_cache_dir)
from fleetlite.data.settings import LEVELS, unknown_or_repeated_levels
from fleetlite.data.shared_store import SharedSampleStore, default_folder
from fleetlite.errors import DataError
from fleetlite.interprocess.private_paths import trusted_folder


def check_levels(levels):
    levels = list(levels)
    problem = unknown_or_repeated_levels(levels)
    if problem:
        raise DataError(f"cache_levels {levels} {problem}: list each of {', '.join(map(repr, LEVELS))} at most once")
    return levels


def describe(function):
    """A name for `function` that is the same in every process (no addresses)."""
    if isinstance(function, functools.partial):
        return f"{describe(function.func)}{function.args}{sorted(function.keywords.items())}"
    return f"{getattr(function, '__module__', '')}.{getattr(function, '__qualname__', type(function).__name__)}"


class CachedSamples:
    """Map-style dataset over `names` (files of `source`) with `labels`; items are
    (*augment(decode(bytes), rng), label as int64 [1]).

    - levels: the cache levels in use (`data_configs.cache_levels`), any of "disk", "memory";
    - cache_dir: the disk level's folder; memory_bytes: the memory level's bound for the node;
    - decode(bytes) -> array or tuple of arrays (deterministic: this is what memory keeps);
    - augment(arrays, rng) -> array or tuple (random, after the cache), or None;
    - store_folder: where the node's shared memory file lives (default this user's private
      folder on /dev/shm, /dev/shm/fleetlite-<uid>; any folder given is checked the same way).
    Ranks of a node that build it with the same arguments share one memory store.
    """

    def __init__(self, source, names, labels=None, decode=None, augment=None, *, levels=LEVELS,
                 cache_dir=DEFAULT_CACHE_DIR, memory_bytes=1 << 30, seed=None, store_folder=None):
        self.source, self.names = source, [os.fspath(n) for n in names]
        if not self.names:
            raise DataError(f"no sample files listed for {source!r}")
        if labels is not None and len(labels) != len(self.names):
            raise DataError(f"{len(labels)} labels for {len(self.names)} sample files: give one label per file")
        self.labels = None if labels is None else np.asarray(labels, dtype="int64")
        self.decode, self.augment = decode, augment
        self.levels = check_levels(levels)
        self.seed = job.shared_seed(seed)
        self.epoch = 0
        self.counts = {}
        self.disk = DiskCache(cache_dir, source) if "disk" in self.levels else None
        self.memory = None
        if "memory" in self.levels:
            folder = trusted_folder(store_folder, DataError) if store_folder else default_folder()
            with contextlib.nullcontext() if folder else cache_dir_errors(cache_folder_path(cache_dir)):
                folder = folder or make_cache_dir(cache_dir)     # no /dev/shm: the store lives in cache_dir
                self.memory = SharedSampleStore(os.path.join(folder, self.store_name(cache_dir, memory_bytes)),
                                                len(self.names), memory_bytes)
            atexit.register(self.memory.unlink)

    def store_name(self, cache_dir, memory_bytes):
        """Equal on every rank of a node that reads the same files into the same cache, so they
        share one store (the node rank is part of it, for nodes simulated on one host); a job
        restarted by its fleetrun finds the store its killed run filled. The node's secret from
        fleetrun is part of it, so no other job can compute the name (the folder keeps other
        users out already)."""
        identity = hashlib.sha256()
        for part in (job.node_secret(), cache_folder_path(cache_dir),
                     getattr(self.source, "root", repr(self.source)), describe(self.decode), str(memory_bytes),
                     str(job.topology().node_rank), *self.names):
            identity.update(part.encode() + b"\0")
        return f"cache-{identity.hexdigest()[:32]}"

    def __len__(self):
        return len(self.names)

    def set_epoch(self, epoch):
        """The epoch whose augmentation and counters the next reads use."""
        self.epoch = int(epoch)

    def stats(self, epoch=None):
        """Hit and miss counts of `epoch` (default: the current one) on this rank."""
        return dict(self.counts.get(self.epoch if epoch is None else epoch, {}))

    def __getitem__(self, index):
        index = int(index)
        counts = self.counts.setdefault(self.epoch, Counter())
        arrays = self.memory.get(index) if self.memory is not None else None
        if self.memory is not None:
            counts["memory_hits" if arrays is not None else "memory_misses"] += 1
        if arrays is None:
            arrays = self.decoded(index, counts)
            if self.memory is not None and not self.memory.put(index, arrays):
                counts["memory_not_stored"] += 1
        if self.augment is not None:
            arrays = self.augment(arrays if len(arrays) > 1 else arrays[0],
                                  np.random.default_rng([self.seed % 2**63, self.epoch, index]))
            arrays = arrays if isinstance(arrays, tuple) else (arrays,)
        if self.labels is not None:
            arrays = (*arrays, self.labels[index:index + 1])
        return arrays

    def decoded(self, index, counts):
        """Sample `index` decoded from its bytes (read through the disk level when there is one)."""
        name = self.names[index]
        if self.disk is not None:
            data, hit = self.disk.read(name)
            counts["disk_hits" if hit else "disk_misses"] += 1
        else:
            data = self.source.read(name)
            counts["source_reads"] += 1
        arrays = self.decode(data) if self.decode is not None else np.frombuffer(data, np.uint8)
        return arrays if isinstance(arrays, tuple) else (arrays,)

    def close(self):
        if self.memory is not None:
            self.memory.close()
