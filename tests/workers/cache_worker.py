"""One rank of a node reading through the cache, for tests/data/test_data_cache.py.

argv: SOURCE CACHE_DIR STORE_FOLDER MEMORY_BYTES. Two epochs of the node partition through
the disk and memory levels (a file barrier between them, so the second epoch finds what the
other rank stored; the second through PrefetchLoader), then every sample of the node's partition read from the memory store, and
this process's resident and proportional memory of the store's mapping measured while the
other rank still holds it.
"""
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fleetlite.data import CachedSamples, FileSource, NodePartitionBatchSampler, PrefetchLoader  # noqa: E402
from fleetlite.data.running_job import topology  # noqa: E402
from support.multiprocess import write_result  # noqa: E402


def decode(data):
    return np.frombuffer(data, dtype=np.float32)


def barrier(folder, name, rank, world, timeout=60):
    Path(folder, f"barrier-{name}-{rank}").touch()
    deadline = time.monotonic() + timeout
    while not all(Path(folder, f"barrier-{name}-{r}").exists() for r in range(world)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {name}: the other ranks did not arrive in {timeout} s")
        time.sleep(0.01)


def main():
    source, cache_dir, store_folder, memory_bytes = sys.argv[1:5]
    here = topology()
    names = sorted(os.listdir(source))
    samples = CachedSamples(FileSource(source), names, decode=decode, levels=["disk", "memory"], cache_dir=cache_dir,
                            memory_bytes=int(memory_bytes), seed=0, store_folder=store_folder)
    sampler = NodePartitionBatchSampler(samples, 4)
    seen = 0
    for batch in sampler:                                                   # epoch 0, read in this thread
        seen += len([samples[i] for i in batch])
    stats = [{**samples.stats(0), "seen": seen}]
    barrier(store_folder, "epoch0", here.rank, here.world_size)
    seen = sum(len(batch[0]) for batch in PrefetchLoader(samples, sampler))  # epoch 1, read ahead by a thread
    stats.append({**samples.stats(1), "seen": seen})
    checksum = sum(float(samples.memory.get(i)[0].sum()) for i in sampler.partition)
    barrier(store_folder, "touched", here.rank, here.world_size)      # both map every page before measuring
    rss, pss = samples.memory.mapped_memory()
    allocated = samples.memory.allocated_bytes()
    barrier(store_folder, "measured", here.rank, here.world_size)
    write_result({"stats": stats, "rss": rss, "pss": pss, "allocated": allocated, "used": samples.memory.used,
                  "checksum": checksum, "partition": [sampler.start, sampler.stop], "path": samples.memory.path})


if __name__ == "__main__":
    main()
