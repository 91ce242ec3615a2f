"""One contender of the data benchmark (started by data_loading.py), one process.

    python -m benchmarks.data.data_worker sampler:<paddle|fleetlite|fleetlite_class_balanced|fleetlite_pk> SAMPLES
    python -m benchmarks.data.data_worker records:<whole|sample_shard_2|sample_shard_8|tarfile_stream> FOLDER

A sampler sample is one epoch of rank 0 of 8 (all its batches as lists of indices), in ms.
A records sample is ms per 1000 samples read and decoded by one worker: its sample shard
(worker 0 of 2, or the middle worker 3 of 8: ranges that start and end inside files), the
files whole through the same index, or the files whole streamed by tarfile (no index). A shard
is read as many times as it takes to read as many samples as the whole files hold, so every
sample of the benchmark times the same amount of work.
"""
import glob
import os
import sys
import tarfile
import time

import numpy as np

from benchmarks.harness.worker_loop import serve

WORLD, BATCH, CLASSES = 8, 64, 1000


def sampler_epoch(kind, samples):
    if kind == "paddle":
        import paddle

        sampler = paddle.io.DistributedBatchSampler(range(samples), BATCH, num_replicas=WORLD, rank=0, shuffle=True)
    else:
        from fleetlite import data

        labels = np.random.default_rng(0).integers(0, CLASSES, samples)
        sampler = {"fleetlite": lambda: data.DistributedBatchSampler(samples, BATCH, WORLD, 0, seed=0),
                   "fleetlite_class_balanced": lambda: data.ClassBalancedBatchSampler(
                       labels, BATCH, num_replicas=WORLD, rank=0, seed=0),
                   "fleetlite_pk": lambda: data.PKBatchSampler(labels, 16, 4, num_replicas=WORLD, rank=0, seed=0),
                   }[kind]()
    return lambda: sum(len(batch) for batch in sampler)


def records_read(kind, folder):
    from fleetlite.data import shard_files

    files = sorted(glob.glob(os.path.join(folder, "*.tar")))
    if kind == "tarfile_stream":
        total = len(shard_files(files, rank=0, world=1))

        def read():
            for path in files:
                with tarfile.open(path, "r|") as tar:
                    for member in tar:
                        payload = tar.extractfile(member).read()
                        if member.name.endswith(".cls"):
                            int(payload)
        return read, total
    world, rank = {"whole": (1, 0), "sample_shard_2": (2, 0), "sample_shard_8": (8, 3)}[kind]
    shard = shard_files(files, rank=rank, world=world)
    passes = max(1, round(sum(shard.sizes) / len(shard)))
    return (lambda: sum(1 for _ in range(passes) for _ in shard)), passes * len(shard)


def main():
    contender, argument = sys.argv[1], sys.argv[2]
    section, kind = contender.split(":")
    if section == "sampler":
        serve(sampler_epoch(kind, int(argument)), lambda: None)
        return
    read, count = records_read(kind, argument)

    def per_thousand():
        started = time.perf_counter()
        read()
        return (time.perf_counter() - started) * 1000.0 / count * 1000

    serve(per_thousand, lambda: None)


if __name__ == "__main__":
    main()
