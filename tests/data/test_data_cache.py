"""The multi-level sample cache: hit and miss counts per epoch, feeds identical to an uncached
run, the memory bound with a fixed resident subset, a job killed in its first epoch that
restarts without a torn entry, a memory slot whose writer was killed mid-write reclaimed by one
later writer, one copy shared by the ranks of a node (resident memory measured), the
node-partition sampler, and the prefetcher."""
import functools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import fleetlite as fleet
from fleetlite.data import (CachedSamples, FileSource, NodePartitionBatchSampler, PrefetchLoader, ThrottledSource,
                            image_list, image_loader, loader)
from fleetlite.data.disk_cache import DiskCache
from fleetlite.data.image_transforms import augment_image, decode_image
from fleetlite.data.prefetch import Prefetcher
from fleetlite.data.shared_store import RESERVED, SharedSampleStore
from fleetlite.errors import DataError
from support.multiprocess import run_job

WORKER = Path(__file__).resolve().parents[1] / "workers" / "cache_worker.py"
FLOATS = 2560                                   # 10 KiB samples for the memory-bound checks


def float_files(folder, count, floats=FLOATS):
    folder.mkdir()
    for i in range(count):
        np.arange(i, i + floats, dtype=np.float32).tofile(folder / f"{i:04d}.bin")
    return folder, sorted(os.listdir(folder))


def floats(data):
    return np.frombuffer(data, dtype=np.float32)


def epoch_feeds(batches):
    return [[field.copy() for field in batch] for batch in batches]


def test_epoch_one_misses_every_level_epoch_two_hits_memory_and_feeds_equal_an_uncached_run(tmp_path, photos):
    root, names, labels = image_list(photos)
    assert labels == [0] * 10 + [1] * 10 + [2] * 10 and names[0] == "class0/000.jpg"
    decode, augment = functools.partial(decode_image, size=24), functools.partial(augment_image, crop=16)

    def batches(levels):
        samples = CachedSamples(ThrottledSource(root, 200, 1), names, labels, decode, augment, levels=levels,
                                cache_dir=tmp_path / "cache", memory_bytes=1 << 20, seed=3, store_folder=tmp_path)
        return samples, PrefetchLoader(samples, NodePartitionBatchSampler(samples, 8, 1, 1, 0, seed=3))

    cached, cached_batches = batches(["disk", "memory"])
    plain, plain_batches = batches([])
    for epoch in range(3):
        with_cache, without = epoch_feeds(cached_batches), epoch_feeds(plain_batches)
        assert len(with_cache) == len(without) == 4
        for mine, theirs in zip(with_cache, without):
            assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(mine, theirs))
        assert with_cache[0][0].shape == (8, 3, 16, 16) and with_cache[0][1].shape == (8, 1)
    total = sum(os.path.getsize(os.path.join(root, name)) for name in names)
    assert cached.source.bytes_read == total and plain.source.bytes_read >= 3 * total   # cached: epoch 1 only
    assert cached.stats(0) == {"memory_misses": 30, "disk_misses": 30}
    assert cached.stats(1) == cached.stats(2) == {"memory_hits": 30}
    assert plain.stats(1) == {"source_reads": 30}
    assert not np.array_equal(epoch_feeds(cached_batches)[0][0], with_cache[0][0])   # augmentation differs per epoch
    assert cached_batches.wait_s.keys() == {0, 1, 2, 3}


def test_the_memory_level_stays_within_its_bound_and_keeps_a_fixed_resident_subset(tmp_path):
    source, names = float_files(tmp_path / "source", 40)
    bound = 64 << 10
    samples = CachedSamples(FileSource(source), names, decode=floats, levels=["disk", "memory"],
                            cache_dir=tmp_path / "cache", memory_bytes=bound, store_folder=tmp_path)
    batches = PrefetchLoader(samples, NodePartitionBatchSampler(samples, 5, 1, 1, 0))
    resident_sets = []
    for epoch in range(3):
        for _ in batches:
            pass
        resident_sets.append({i for i in range(40) if i in samples.memory})
    resident = len(resident_sets[0])
    assert resident == bound // samples.memory.table["nbytes"].max() == 6     # 10 KiB + headers each
    assert resident_sets[0] == resident_sets[1] == resident_sets[2]           # never evicted, never replaced
    assert samples.memory.used <= bound
    allocated = os.stat(samples.memory.path).st_blocks * 512
    assert allocated <= samples.memory.arena_start + bound
    assert samples.stats(0) == {"memory_misses": 40, "disk_misses": 40, "memory_not_stored": 34}
    assert samples.stats(1) == {"memory_hits": 6, "memory_misses": 34, "disk_hits": 34, "memory_not_stored": 34}
    assert all(np.array_equal(samples[i][0], np.arange(i, i + FLOATS, dtype=np.float32)) for i in range(40))


KILLED_READER = """
import sys
from fleetlite.data import CachedSamples, ThrottledSource
source, names, cache, store = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
samples = CachedSamples(ThrottledSource(source, 5, 2), names, levels=["disk", "memory"], cache_dir=cache,
                        memory_bytes=1 << 20, store_folder=store)
for i in range(len(samples)):
    samples[i]
"""


def test_a_job_killed_in_its_first_epoch_leaves_no_torn_entry_and_the_restart_resumes(tmp_path):
    source, names = float_files(tmp_path / "source", 30, floats=64 << 10)   # 256 KiB: ~50 ms each at 5 MB/s
    cache, store = tmp_path / "cache", tmp_path / "store"
    store.mkdir()
    reader = subprocess.Popen([sys.executable, "-c", KILLED_READER, str(source), ",".join(names), str(cache),
                               str(store)], start_new_session=True)
    entries = cache / "entries"
    deadline = time.monotonic() + 60
    while len(list(entries.glob("*.bin"))) < 5 if entries.exists() else True:
        assert time.monotonic() < deadline and reader.poll() is None, "the reader never copied 5 files"
        time.sleep(0.01)
    os.killpg(reader.pid, signal.SIGKILL)
    reader.wait(timeout=30)
    copied = sorted(p.name for p in entries.glob("*.bin"))
    assert 5 <= len(copied) < 30
    for name in copied:                                               # every entry whole, none torn
        assert (entries / name).read_bytes() == (source / name).read_bytes()

    restarted = CachedSamples(FileSource(source), names, levels=["disk", "memory"],
                              cache_dir=cache, memory_bytes=1 << 20, store_folder=store)
    assert os.listdir(cache / "partial") == []                        # the dead reader's partial copy is gone
    in_memory = [i for i in range(30) if i in restarted.memory]
    assert in_memory and set(in_memory) <= {names.index(n) for n in copied}
    for i in range(30):
        assert restarted[i][0].tobytes() == (source / names[i]).read_bytes()
    stats = restarted.stats(0)
    assert stats["memory_hits"] == len(in_memory)
    assert stats["disk_hits"] == len(copied) - len(in_memory) and stats["disk_misses"] == 30 - len(copied)


STALLED_WRITER = """
import sys, time
from pathlib import Path
from fleetlite.data import CachedSamples, FileSource
from fleetlite.data.shared_store import SharedSampleStore
source, names, cache, store, marker = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4], sys.argv[5]

def write_half_then_hang(self, start, arrays):       # a writer killed in the middle of its copy
    self._map[start:start + 64] = b"x" * 64
    Path(marker).touch()
    time.sleep(60)

SharedSampleStore._write = write_half_then_hang
samples = CachedSamples(FileSource(source), names, levels=["memory"], cache_dir=cache, memory_bytes=1 << 20,
                        store_folder=store)
samples[2]
"""


def test_a_slot_whose_writer_was_killed_mid_write_is_reclaimed_by_one_later_writer_and_then_hit(tmp_path):
    source, names = float_files(tmp_path / "source", 4)
    store, marker = tmp_path / "store", tmp_path / "reserved"
    store.mkdir()
    settings = dict(levels=["memory"], cache_dir=tmp_path / "cache", memory_bytes=1 << 20, store_folder=store)
    writer = subprocess.Popen([sys.executable, "-c", STALLED_WRITER, str(source), ",".join(names),
                               str(settings["cache_dir"]), str(store), str(marker)], start_new_session=True)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline and writer.poll() is None, "the writer never reserved sample 2"
        time.sleep(0.01)
    os.killpg(writer.pid, signal.SIGKILL)
    writer.wait(timeout=30)

    reader = CachedSamples(FileSource(source), names, **settings)       # the writer's store: same arguments
    state, _, _, pid = reader.memory.table[2]
    assert (state, pid) == (RESERVED, writer.pid) and 2 not in reader.memory   # reserved by the dead, never read
    rivals = [SharedSampleStore(reader.memory.path, 4, 1 << 20) for _ in range(2)]   # two writers (own locks)
    sample = (np.frombuffer((source / names[2]).read_bytes(), np.uint8),)   # what the writer was storing
    with ThreadPoolExecutor(2) as pool:
        stored = list(pool.map(lambda store: store.put(2, sample), rivals))
    assert sorted(stored) == [False, True]                          # exactly one reclaims the slot
    assert reader.memory.table[2]["writer"] == os.getpid() and reader.memory.used == reader.memory.table[2]["nbytes"]
    assert np.array_equal(reader[2][0], sample[0]) and reader.stats(0) == {"memory_hits": 1}
    for rival in rivals:
        rival.close()


def test_two_ranks_of_a_node_share_one_copy_of_the_memory_level(tmp_path):
    source, _ = float_files(tmp_path / "source", 64, floats=16 << 10)        # 64 samples of 64 KiB: 4 MiB
    store = tmp_path / "store"
    store.mkdir()
    ranks = run_job(WORKER, 2, args=[source, tmp_path / "cache", store, 8 << 20], timeout=120)
    data = 64 * (64 << 10)
    for rank in ranks:
        assert rank["partition"] == [0, 64] and [s["seen"] for s in rank["stats"]] == [32, 32]
        assert rank["stats"][1] == {"memory_hits": 32, "seen": 32}
        assert rank["checksum"] == ranks[0]["checksum"]
        assert rank["rss"] >= data                      # each rank maps and reads the whole copy...
    assert sum(r["stats"][0]["memory_misses"] for r in ranks) == 64
    assert sum(r["stats"][0]["disk_misses"] for r in ranks) == 64       # ...each sample copied and stored once
    assert ranks[0]["path"] == ranks[1]["path"] and ranks[0]["used"] < data * 1.01
    assert data <= ranks[0]["allocated"] < data * 1.05                 # one copy on the node
    assert sum(r["pss"] for r in ranks) < data * 1.05, ranks           # ...split between the two ranks


def test_concurrent_readers_copy_each_file_once(tmp_path):
    source, names = float_files(tmp_path / "source", 3)
    reads = Counter()

    class CountingSource(FileSource):
        def read(self, name):
            reads[name] += 1
            time.sleep(0.02)
            return super().read(name)

    caches = [DiskCache(tmp_path / "cache", CountingSource(source)) for _ in range(4)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda job: caches[job % 4].read(names[job % 3]), range(24)))
    assert reads == Counter({name: 1 for name in names})
    assert sum(not hit for _, hit in results) == 3


def test_node_partitions_are_fixed_disjoint_shuffled_within_and_equal_in_batches():
    size, nodes, per_node = 37, 2, 2
    for policy in ("pad", "drop"):
        samplers = [NodePartitionBatchSampler(size, 4, nodes, per_node, rank, seed=1, equal_batches=policy)
                    for rank in range(nodes * per_node)]
        assert [(s.start, s.stop) for s in samplers] == [(0, 18), (0, 18), (18, 37), (18, 37)]
        for epoch in range(3):
            batches = [s.batches(epoch) for s in samplers]
            assert len({len(b) for b in batches}) == 1 and len({tuple(map(len, b)) for b in batches}) == 1
            for s, mine in zip(samplers, batches):
                assert {i for batch in mine for i in batch} <= set(s.partition)
            node0 = [i for b in batches[0] + batches[1] for i in b]
            node1 = [i for b in batches[2] + batches[3] for i in b]
            if policy == "pad":                 # every rank 10 samples: the 18-sample node repeats 2
                assert set(node0) == set(range(18)) and set(node1) == set(range(18, 37)) and len(node0) == 20
            else:                               # every rank 9: the 19-sample node leaves 1 out
                assert len(set(node0)) == 18 and len(set(node1)) == 18 and len(node1) == 18
        assert samplers[0].batches(0) != samplers[0].batches(1)
    with pytest.raises(DataError, match="rank 0: 9, rank 1: 9, rank 2: 9, rank 3: 10"):
        NodePartitionBatchSampler(size, 4, nodes, per_node, 0, equal_batches="error")


def test_the_prefetcher_reads_ahead_raises_the_readers_error_and_stops_when_closed():
    produced = []

    def items():
        for i in range(100):
            produced.append(i)
            yield i
    reader = Prefetcher(items(), depth=3)
    assert next(reader) == 0
    time.sleep(0.2)
    assert len(produced) <= 5                       # bounded read-ahead: depth 3 + one in hand
    reader.close()
    assert not reader._thread.is_alive()

    def failing():
        yield 1
        raise ValueError("bad sample 7")
    with pytest.raises(ValueError, match="bad sample 7"):
        list(Prefetcher(failing()))


def test_the_loader_reads_the_next_epoch_ahead_unless_set_epoch_picks_another():
    class Indices:
        def __init__(self):
            self.epochs = []

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

        def __getitem__(self, index):
            return (np.array(index),)

    def order(batches):
        return [batch[0].tolist() for batch in batches]
    sampler = NodePartitionBatchSampler(12, 4, 1, 1, 0, seed=2)
    dataset = Indices()
    batches = PrefetchLoader(dataset, sampler, prefetch=2)
    assert order(batches) == sampler.batches(0) and dataset.epochs == [0, 1]    # epoch 1 started at once
    assert order(batches) == sampler.batches(1)
    batches.batch_sampler.set_epoch(7)
    assert order(batches) == sampler.batches(7) and dataset.epochs == [0, 1, 2, 7, 8]
    batches.close()                                  # drops the read-ahead of epoch 8, which comes next
    assert order(batches) == sampler.batches(8) and batches.wait_s.keys() == {0, 1, 7, 8}


def test_image_loader_reads_the_cache_settings_from_the_strategy_and_names_bad_ones(tmp_path, photos):
    strategy = fleet.DistributedStrategy()
    strategy.data_configs = {"cache_levels": ["disk", "memory"], "cache_dir": str(tmp_path / "cache"),
                             "memory_cache_MB": 1}
    batches = image_loader(photos, strategy, 6, crop=16, resize=20)
    assert isinstance(batches.batch_sampler, NodePartitionBatchSampler) and len(batches) == 5
    assert batches.dataset.memory.capacity == 1 << 20 and batches.dataset.disk.folder == str(tmp_path / "cache")
    assert sum(len(b[0]) for b in batches) == 30 and batches.dataset.stats(0)["disk_misses"] == 30
    batches.dataset.memory.unlink()
    strategy.data_configs = {"cache_levels": ["memory", "memory"]}
    with pytest.raises(DataError, match="list each of 'disk', 'memory' at most once"):
        image_loader(photos, strategy, 6)
    with pytest.raises(DataError, match="neither a folder of class folders nor a file list"):
        image_loader(tmp_path / "missing", fleet.DistributedStrategy(), 6)
    strategy.data_configs = {"cache_levels": ["disk"]}
    with pytest.raises(DataError, match=r"cache_levels = \['disk'\] cache sample files: use fleetlite.data.image_loader"):
        loader(list(range(10)), strategy, 2)
    strategy.data_configs = {"cache_levels": [], "loader": "dali"}
    with pytest.raises(DataError, match="loader = 'dali' reads image files itself"):
        loader(list(range(10)), strategy, 2)
