"""Every rank reads every sample file of SOURCE twice through the disk and memory levels of the
sample cache, at their default places (or the disk level in CACHE_DIR when given), and fits a least-squares line to the samples; writes
OUT/rank<r>.json. For the shared-host tests: what a job reads, and where it keeps it."""
import json
import os
import sys

import numpy as np

from fleetlite.data import CachedSamples, FileSource
from fleetlite.data.running_job import topology


def floats(data):
    return np.frombuffer(data, dtype=np.float32)


def main():
    source, out, *cache_dir = sys.argv[1:]
    names = sorted(os.listdir(source))
    samples = CachedSamples(FileSource(source), names, decode=floats, levels=["disk", "memory"],
                            memory_bytes=1 << 20, seed=0, **({"cache_dir": cache_dir[0]} if cache_dir else {}))
    features = np.stack([samples[i][0] for i in range(len(names))])
    samples.set_epoch(1)
    assert all(np.array_equal(samples[i][0], features[i]) for i in range(len(names)))
    weights = np.linalg.lstsq(features[:, :-1], features[:, -1], rcond=None)[0]
    with open(os.path.join(out, f"rank{topology().rank}.json"), "w") as result:
        json.dump({"features": features.tolist(), "weights": weights.tolist(), "store": samples.memory.path,
                   "cache": samples.disk.folder, "stats": [samples.stats(0), samples.stats(1)]}, result)
    samples.close()


if __name__ == "__main__":
    main()
