"""Per-worker shards of record files: WebDataset tar shards read through a byte-offset index.

The format is WebDataset's: a plain tar whose members `<key>.<ext>` with the same key form
one sample (`000042.npy` + `000042.cls`), readable by `tarfile`, `tar` and the `webdataset`
library. What fleetlite adds is an index per file (each sample's members, their byte offsets
and sizes), built once by reading the tar headers and cached beside the file as
`<file>.idx.json`; it is rebuilt when the file's size or mtime changes.

With the index, the files are one contiguous sequence of samples and a worker's shard is a
range of it: sharding by sample works with fewer files than workers and the shards differ by
at most one sample (DALI shards TFRecord and WebDataset inputs the same way, and needs index
files for it). tf.data's file sharding refuses fewer files than workers; Horovod users were
told to write 10x more files than workers (horovod#249). `by="file"` is there too, for files
that are only reachable by whole-file streaming.
"""
import bisect
import glob
import io
import json
import os
import tarfile

import numpy as np

from fleetlite.data import running_job as job
from fleetlite.errors import DataError

INDEX_SUFFIX = ".idx.json"
INDEX_FORMAT = "fleetlite-webdataset-index/1"
READ_CHUNK = 256 << 10   # per sequential read: faster from the page cache than 1 or 8 MiB (measured)


def split_member_name(name):
    """WebDataset's rule: the key is the path up to the first dot of the file name."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext


class RecordIndex:
    """The samples of one tar file: keys and, per sample, [(ext, offset, size)] of its members."""

    def __init__(self, path, keys, members):
        self.path, self.keys, self.members = path, keys, members
        self.first = np.array([m[0][1] for m in members], dtype="int64")   # each sample's byte span
        self.last = np.array([m[-1][1] + m[-1][2] for m in members], dtype="int64")

    def __len__(self):
        return len(self.keys)

    def span(self, start, stop):
        """Byte range [first, last) holding samples start..stop-1."""
        return int(self.first[start]), int(self.last[stop - 1])

    @classmethod
    def build(cls, path):
        keys, members = [], []
        with tarfile.open(path, "r:") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                key, ext = split_member_name(info.name)
                if not keys or keys[-1] != key:
                    keys.append(key)
                    members.append([])
                members[-1].append((ext, info.offset_data, info.size))
        return cls(path, keys, members)

    @classmethod
    def load(cls, path):
        """The cached index of `path`, built and written beside it when missing or stale (kept
        in memory only when the folder is read-only)."""
        stat = os.stat(path)
        stamp = {"format": INDEX_FORMAT, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        cached = path + INDEX_SUFFIX
        try:
            with open(cached) as source:
                saved = json.load(source)
            if all(saved.get(k) == v for k, v in stamp.items()):
                return cls(path, saved["keys"], saved["members"])
        except (OSError, ValueError, KeyError):
            pass
        index = cls.build(path)
        try:
            with open(cached + ".tmp", "w") as out:
                json.dump({**stamp, "keys": index.keys, "members": index.members}, out)
            os.replace(cached + ".tmp", cached)
        except OSError:
            pass
        return index


def default_decode(sample):
    """`cls` -> int, `npy` -> array, everything else stays bytes."""
    decoded = {}
    for ext, payload in sample.items():
        if ext == "cls":
            decoded[ext] = int(payload)
        elif ext == "npy":
            decoded[ext] = np.load(io.BytesIO(payload))
        else:
            decoded[ext] = payload
    return decoded


class RecordShard:
    """One worker's samples: ranges of indexed tar files, as a map-style dataset.

    `shard[i]` reads sample i with one seek and one read; iterating reads each range in large
    sequential chunks. `sizes` holds every worker's shard size (all computed from the indexes,
    without communication), which is what ShardBatchSampler and `loader` equalise.
    Items are `transform(decode({ext: bytes}))`.
    """

    def __init__(self, pieces, sizes, rank, decode=default_decode, transform=None):
        self.pieces = [(index, start, stop) for index, start, stop in pieces if stop > start]
        self.sizes, self.rank = list(sizes), rank
        self.decode, self.transform = decode, transform
        self._ends = np.cumsum([stop - start for _, start, stop in self.pieces]).tolist()
        self._files, self._pid = {}, None

    def __len__(self):
        return self._ends[-1] if self._ends else 0

    @property
    def imbalance(self):
        """Largest minus smallest shard, in samples, before any equalising."""
        return max(self.sizes) - min(self.sizes)

    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} of a shard of {len(self)}")
        piece = bisect.bisect_right(self._ends, i)
        index, start, _ = self.pieces[piece]
        sample = start + i - (self._ends[piece - 1] if piece else 0)
        first, last = index.span(sample, sample + 1)
        handle = self._file(index.path)
        handle.seek(first)
        return self._item(index.members[sample], handle.read(last - first), first)

    def __iter__(self):
        for index, start, stop in self.pieces:
            with open(index.path, "rb") as handle:
                sample = start
                while sample < stop:    # as many whole samples as fit in one chunk, at least one
                    first = int(index.first[sample])
                    end = int(np.searchsorted(index.last, first + READ_CHUNK, side="right"))
                    end = min(max(end, sample + 1), stop)
                    handle.seek(first)
                    data = handle.read(int(index.last[end - 1]) - first)
                    for s in range(sample, end):
                        yield self._item(index.members[s], data, first)
                    sample = end

    def _item(self, members, data, base):
        sample = {ext: data[offset - base:offset - base + size] for ext, offset, size in members}
        sample = self.decode(sample) if self.decode else sample
        return self.transform(sample) if self.transform else sample

    def _file(self, path):
        if self._pid != os.getpid():   # DataLoader workers are forked: open files anew
            self._files, self._pid = {}, os.getpid()
        if path not in self._files:
            self._files[path] = open(path, "rb")
        return self._files[path]


def record_files(files):
    """A sorted glob pattern, or a list of paths, as a list of existing files."""
    paths = sorted(glob.glob(files)) if isinstance(files, str) else [os.fspath(f) for f in files]
    if not paths:
        raise DataError(f"no record files in {files!r}")
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise DataError(f"record files not found: {missing[:5]}")
    return paths


def shard_files(files, rank=None, world=None, by="sample", decode=default_decode, transform=None):
    """This worker's RecordShard of `files` (paths or a glob), for `world` workers.

    by="sample": the files are one sequence of S samples; worker r reads samples
    [floor(rS/W), floor((r+1)S/W)), so shards differ by at most one sample, whatever the file
    count. by="file": worker r reads files r, r+W, ... whole (needs at least W files; shards
    differ by as much as the files do).
    """
    world, rank = job.replicas_and_rank(world, rank)
    indexes = [RecordIndex.load(path) for path in record_files(files)]
    counts = [len(index) for index in indexes]
    if by == "file":
        if len(indexes) < world:
            raise DataError(f"by='file' needs at least one file per worker: {len(indexes)} files for "
                            f"{world} workers; use by='sample', which works with any number of files")
        sizes = [sum(counts[r::world]) for r in range(world)]
        pieces = [(index, 0, len(index)) for index in indexes[rank::world]]
    elif by == "sample":
        total = sum(counts)
        bounds = [r * total // world for r in range(world + 1)]
        sizes = [bounds[r + 1] - bounds[r] for r in range(world)]
        pieces, offset = [], 0
        for index in indexes:
            start, stop = max(bounds[rank] - offset, 0), min(bounds[rank + 1] - offset, len(index))
            if start < stop:
                pieces.append((index, start, stop))
            offset += len(index)
    else:
        raise DataError(f"by={by!r}: shard by 'sample' or 'file'")
    return RecordShard(pieces, sizes, rank, decode, transform)
