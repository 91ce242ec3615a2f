"""One rank of benchmarks/data/data_cache.py (argv: a JSON settings string). Writes its timings to
settings["out"]/rank.RANK.json.

Throughput: epochs of this rank's batches of the JPEG set, no compute, interleaved per round:
uncached (every read from the throttled source), the cache's epoch >= 2 (memory level), and
the same decoded samples as .npy files read from the OS page cache, each delivering the decoded
samples, augmented in Python (PIL/numpy in the prefetch thread), or augmented in DALI CPU
operators (the DALI path with the cache); the cache's first epoch (cold) is timed once. Stall: data parallel training
(fleet, gloo all-reduce) of the digits MLP and of a small conv net on the JPEGs, fed from the
cache; the stall is the time a step waited for its batch, over epochs >= 2.
"""
import functools
import json
import os
import sys
import time

import numpy as np

from fleetlite.data import (CachedSamples, NodePartitionBatchSampler, PrefetchLoader, ThrottledSource, all_reduce_sums,
                            image_list)
from fleetlite.data.dali_augmentation import DaliAugmentation
from fleetlite.data.image_loader import stacked
from fleetlite.data.image_transforms import augment_image, decode_image
from fleetlite.data.running_job import topology


def barrier():
    """Start together: a gloo all-reduce between the ranks."""
    all_reduce_sums([0.0])


class PageCacheSamples:
    """The decoded samples as .npy files on local disk (read from the page cache), same augment."""

    def __init__(self, folder, labels, augment, seed):
        self.folder, self.labels, self.augment, self.seed, self.epoch = folder, labels, augment, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __getitem__(self, index):
        image = np.load(os.path.join(self.folder, f"{index}.npy"))
        if self.augment is not None:
            image = self.augment(image, np.random.default_rng([self.seed, self.epoch, index]))
        return image, np.array([self.labels[index]], dtype="int64")


def timed_epoch(batches):
    """Seconds for one epoch; no reading ahead into the next (it would run during another
    contender's epoch)."""
    start = time.perf_counter()
    for _ in batches:
        pass
    elapsed = time.perf_counter() - start
    batches.close()
    return elapsed


def throughput(settings, here):
    """Epoch times of every (contender, variant): "decoded" delivers the decoded samples (the
    data path the cache replaces), "augmented" adds the random crop, flip and normalize in
    Python, "dali_augmented" the same in DALI's CPU operators on `threads` threads."""
    root, names, labels = image_list(settings["images"])
    source = ThrottledSource(root, settings["bandwidth_MBps"], settings["latency_ms"])
    decode = functools.partial(decode_image, size=settings["resize"])
    sampler = NodePartitionBatchSampler(len(names), settings["batch"], seed=0)
    page_folder = os.path.join(settings["cache_dir"], f"decoded-{here.rank}")
    os.makedirs(page_folder, exist_ok=True)
    for index in sampler.partition:
        with open(os.path.join(root, names[index]), "rb") as jpeg:
            np.save(os.path.join(page_folder, f"{index}.npy"), decode(jpeg.read()))
    python_augment = functools.partial(augment_image, crop=settings["crop"])
    dali_augment = DaliAugmentation(settings["batch"], here.rank, 0, crop=settings["crop"], resize=settings["resize"],
                                    num_threads=settings["threads"])
    contenders = {}
    for variant, augment, assemble in (("decoded", None, stacked), ("augmented", python_augment, stacked),
                                       ("dali_augmented", None, dali_augment)):
        for name, levels in (("cached", ["disk", "memory"]), ("uncached", [])):
            samples = CachedSamples(source, names, labels, decode, augment, levels=levels, seed=0,
                                    cache_dir=settings["cache_dir"], memory_bytes=settings["memory_cache_MB"] << 20)
            contenders[f"{name}/{variant}"] = PrefetchLoader(samples, sampler, assemble=assemble)
        page = PageCacheSamples(page_folder, labels, augment, 0)
        contenders[f"page_cache/{variant}"] = PrefetchLoader(page, sampler, assemble=assemble)
    cold = contenders["cached/decoded"]
    barrier()
    cold_s = timed_epoch(cold)                       # the first epoch: source -> disk -> memory
    stats_cold = cold.dataset.stats(sampler.epoch - 1)
    for name, batches in contenders.items():
        if name.startswith("page_cache"):
            timed_epoch(batches)                        # into the page cache
    rounds = {name: [] for name in contenders}
    for _ in range(settings["rounds"]):
        for name, batches in contenders.items():
            barrier()
            epoch = batches.batch_sampler.epoch
            rounds[name].append(timed_epoch(batches))
            if batches is cold:
                stats_last = cold.dataset.stats(epoch)
    memory = cold.dataset.memory
    rss, pss = memory.mapped_memory()
    result = {"epoch1_s": cold_s, "epochs_s": rounds, "stats_epoch1": stats_cold,
              "stats_last": stats_last, "store_allocated": memory.allocated_bytes(),
              "store_used": memory.used, "store_rss": rss, "store_pss": pss}
    barrier()
    return result


def stall(settings, strategy):
    import paddle

    import fleetlite as fleet
    results = {}
    for model in ("digits_mlp", "convnet"):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            if model == "digits_mlp":
                x = paddle.static.data("x", [None, 64], "float32")
                logits = paddle.nn.Sequential(paddle.nn.Linear(64, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 10))(x)
            else:
                x = paddle.static.data("x", [None, 3, settings["crop"], settings["crop"]], "float32")
                net = paddle.nn.Sequential(paddle.nn.Conv2D(3, 16, 3, stride=2, padding=1), paddle.nn.ReLU(),
                                           paddle.nn.Conv2D(16, 32, 3, stride=2, padding=1), paddle.nn.ReLU(),
                                           paddle.nn.AdaptiveAvgPool2D(1), paddle.nn.Flatten(), paddle.nn.Linear(32, 10))
                logits = net(x)
            label = paddle.static.data("label", [None, 1], "int64")
            loss = paddle.nn.functional.cross_entropy(logits, label)
            fleet.distributed_optimizer(paddle.optimizer.SGD(0.01), strategy).minimize(loss)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        batches = digits_batches(settings) if model == "digits_mlp" else image_batches(settings)
        epochs = []
        for epoch in range(settings["stall_epochs"]):
            start = time.perf_counter()
            for features, labels in batches:
                exe.run(main, feed={"x": features, "label": labels}, fetch_list=[loss])
            epochs.append({"epoch_s": time.perf_counter() - start, "wait_s": batches.wait_s[epoch]})
        later = epochs[1:]
        results[model] = {"epochs": epochs, "stats": batches.dataset.stats(),
                          "stall_fraction": sum(e["wait_s"] for e in later) / sum(e["epoch_s"] for e in later)}
        batches.close()
        batches.dataset.close()
    return results


def digits_batches(settings):
    root = settings["digits"]
    names = sorted(os.listdir(root))
    labels = [int(name.split("_")[1].split(".")[0]) for name in names]
    samples = CachedSamples(ThrottledSource(root, settings["bandwidth_MBps"], settings["latency_ms"]), names, labels,
                            decode=lambda data: np.frombuffer(data, np.float32), levels=["disk", "memory"],
                            cache_dir=settings["cache_dir"] + "-digits", memory_bytes=64 << 20, seed=0)
    return PrefetchLoader(samples, NodePartitionBatchSampler(samples, 32, seed=0))


def image_batches(settings):
    root, names, labels = image_list(settings["images"])
    samples = CachedSamples(ThrottledSource(root, settings["bandwidth_MBps"], settings["latency_ms"]), names, labels,
                            functools.partial(decode_image, size=settings["resize"]),
                            functools.partial(augment_image, crop=settings["crop"]), levels=["disk", "memory"],
                            cache_dir=settings["cache_dir"], memory_bytes=settings["memory_cache_MB"] << 20, seed=0)
    return PrefetchLoader(samples, NodePartitionBatchSampler(samples, settings["batch"], seed=0))


def main():
    import paddle

    import fleetlite as fleet
    settings = json.loads(sys.argv[1])
    paddle.enable_static()
    strategy = fleet.DistributedStrategy()
    fleet.init(is_collective=True, strategy=strategy)
    here = topology()
    result = {"rank": here.rank, "throughput": throughput(settings, here), "stall": stall(settings, strategy)}
    with open(os.path.join(settings["out"], f"rank.{here.rank}.json"), "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main()
