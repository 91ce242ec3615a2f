"""Benchmark (d): the multi-level cache and the DALI CPU loader.

    .venv/bin/python -m benchmarks.data.data_cache [--quick] [--images 320] [--rounds 3] [--json out.json]

1. Data throughput per epoch, 2 ranks on one node, ImageNet-like JPEGs (500x375, ~110 KB)
   behind a throttled source (default 50 MB/s and 5 ms per file, per reader): the cache's cold
   first epoch, its later epochs (memory level, shared by the two ranks), no cache (every
   read from the source), and the same decoded samples read as .npy files from the OS page
   cache; each delivering the decoded samples, or augmented (random resized crop, flip,
   normalize) in Python, or in DALI's CPU operators fed from the cache (the DALI path with the
   cache). Epochs other than the cold one are interleaved round by round; an epoch's time is
   the slower rank's. Targets: cached epoch >= 5x faster than uncached, and >= 1.0x the
   page-cache read.
2. Data stall in epochs >= 2 with the cache: the digits MLP and a small conv net trained data
   parallel (gloo) on 2 ranks; stall = time a step waited for its batch / epoch time (< 5%).
3. DALI CPU pipeline vs paddle.io.DataLoader with PIL decoding and the same augmentations,
   the same number of worker threads/processes, one process, interleaved: images/s.
"""
import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from fleetlite.topology.env_contract import worker_env
from fleetlite.topology.topology import Topology
from benchmarks.harness.runner import LoadCheck, free_port

HERE = os.path.dirname(os.path.abspath(__file__))


def write_jpegs(folder, count, classes=10):
    """ImageNet-like photos: 500x375, ~100 KB at quality 90 (smooth gradients plus noise)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:375, 0:500]
    sizes = []
    for i in range(count):
        os.makedirs(os.path.join(folder, f"c{i % classes}"), exist_ok=True)
        base = np.stack([(x * 0.5 + y * 0.2 + i * 7) % 256, (y * 0.6 + i * 3) % 256, ((x + y) * 0.3) % 256], -1)
        picture = np.clip(base + rng.normal(0, 22, base.shape), 0, 255).astype("uint8")
        buffer = io.BytesIO()
        Image.fromarray(picture).save(buffer, "JPEG", quality=90)
        with open(os.path.join(folder, f"c{i % classes}", f"{i:05d}.jpg"), "wb") as out:
            out.write(buffer.getvalue())
        sizes.append(len(buffer.getvalue()))
    return sum(sizes) / len(sizes)


def write_digits(folder):
    from sklearn.datasets import load_digits

    digits = load_digits()
    os.makedirs(folder)
    for i, (row, label) in enumerate(zip(digits.data, digits.target)):
        (row / 16.0).astype(np.float32).tofile(os.path.join(folder, f"{i:05d}_{label}.bin"))


def run_ranks(settings, world=2, timeout=900):
    port = free_port()
    processes = []
    for rank in range(world):
        env = dict(os.environ, **worker_env(Topology.grid(world, rank=rank, base_port=port)), OMP_NUM_THREADS="1",
                   GLOG_minloglevel="2")
        processes.append(subprocess.Popen([sys.executable, os.path.join(HERE, "data_cache_worker.py"),
                                           json.dumps(settings)], env=env))
    load = LoadCheck([p.pid for p in processes])
    deadline = time.monotonic() + timeout
    for process in processes:
        code = process.wait(timeout=max(1, deadline - time.monotonic()))
        if code:
            for other in processes:
                other.kill()
            raise RuntimeError(f"a benchmark rank exited with {code}")
    foreign = load.foreign_share()
    ranks = []
    for rank in range(world):
        with open(os.path.join(settings["out"], f"rank.{rank}.json")) as result:
            ranks.append(json.load(result))
    return ranks, foreign


def decode_throughput(images, batch, threads, rounds, crop):
    """Images/s of one epoch: DALI CPU pipeline vs paddle.io.DataLoader (PIL), interleaved."""
    import functools

    import paddle

    from fleetlite.data import image_list
    from fleetlite.data.dali_pipeline import DaliBatches, image_pipeline
    from fleetlite.data.image_transforms import augment_image

    root, names, labels = image_list(images)
    file_list = os.path.join(os.path.dirname(root), "dali_list.txt")
    with open(file_list, "w") as out:
        out.writelines(f"{os.path.join(root, n)} {label}\n" for n, label in zip(names, labels))
    pipeline = image_pipeline(file_list, batch, 0, 1, crop=crop, num_threads=threads)
    pipeline.build()
    dali = DaliBatches(pipeline, len(names), 1)
    dataset = PilImages(root, names, labels, functools.partial(augment_image, crop=crop))
    paddle_loader = paddle.io.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=threads,
                                         drop_last=False, persistent_workers=True)
    times = {"dali_cpu": [], "paddle_dataloader_pil": []}
    for round_index in range(rounds + 1):            # round 0 warms both up
        for name, loader in (("dali_cpu", dali), ("paddle_dataloader_pil", paddle_loader)):
            start = time.perf_counter()
            count = sum(len(batch_images) for batch_images, _ in loader)
            if round_index:
                times[name].append(count / (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in times.items()}


class PilImages:
    """JPEG files decoded with PIL and augmented like the DALI pipeline (a map-style dataset)."""

    def __init__(self, root, names, labels, augment):
        self.root, self.names, self.labels, self.augment = root, names, labels, augment
        self.draws = np.random.default_rng()

    def __len__(self):
        return len(self.names)

    def __getitem__(self, index):
        from PIL import Image

        with Image.open(os.path.join(self.root, self.names[index])) as image:
            picture = np.asarray(image.convert("RGB"))
        return self.augment(picture, self.draws), np.array([self.labels[index]], dtype="int64")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small version, under a minute")
    parser.add_argument("--images", type=int, default=320)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bandwidth_MBps", type=float, default=50.0)
    parser.add_argument("--latency_ms", type=float, default=5.0)
    parser.add_argument("--threads", type=int, default=2, help="DALI threads = DataLoader workers")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.quick:
        args.images, args.rounds = 24, 1
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fleetlite-bench-cache-") as folder:
        images = os.path.join(folder, "images")
        jpeg_bytes = write_jpegs(images, args.images)
        write_digits(os.path.join(folder, "digits"))
        settings = {"images": images, "digits": os.path.join(folder, "digits"), "out": folder,
                    "cache_dir": os.path.join(folder, "cache"), "bandwidth_MBps": args.bandwidth_MBps,
                    "latency_ms": args.latency_ms, "batch": 16, "resize": 256 if not args.quick else 160,
                    "crop": 224 if not args.quick else 128, "memory_cache_MB": 256, "rounds": args.rounds,
                    "stall_epochs": 3 if not args.quick else 2, "threads": args.threads}
        ranks, foreign = run_ranks(settings)
        decode = decode_throughput(images, 16, args.threads, args.rounds, settings["crop"])

    def epoch(name):   # per round, the slower rank's time; the median over rounds
        return statistics.median(max(r["throughput"]["epochs_s"][name][i] for r in ranks)
                                 for i in range(args.rounds))
    uncached, cached, page = epoch("uncached/decoded"), epoch("cached/decoded"), epoch("page_cache/decoded")

    def augmented(variant):
        times = {name: epoch(f"{name}/{variant}") for name in ("uncached", "cached", "page_cache")}
        return {"uncached_epoch_s": times["uncached"], "cached_epoch_s": times["cached"],
                "page_cache_epoch_s": times["page_cache"],
                "cached_speedup_vs_uncached": times["uncached"] / times["cached"],
                "cached_vs_page_cache": times["page_cache"] / times["cached"]}
    report = {
        "uncached_epoch_s": uncached,
        "epoch1_s": max(r["throughput"]["epoch1_s"] for r in ranks),
        "epoch2_s": cached,
        "page_cache_epoch_s": page,
        "cached_speedup_vs_uncached": uncached / cached,
        "cached_vs_page_cache": page / cached,
        "with_augmentation": augmented("augmented"),
        "with_dali_augmentation": augmented("dali_augmented"),
        "stall_fraction": {model: max(r["stall"][model]["stall_fraction"] for r in ranks)
                           for model in ("digits_mlp", "convnet")},
        "resident_bytes_per_node": ranks[0]["throughput"]["store_allocated"],
        "store_pss_sum_bytes": sum(r["throughput"]["store_pss"] for r in ranks),
        "store_rss_per_rank_bytes": [r["throughput"]["store_rss"] for r in ranks],
        "hits_misses": {"epoch1": [r["throughput"]["stats_epoch1"] for r in ranks],
                        "last_cached_epoch": [r["throughput"]["stats_last"] for r in ranks]},
        "decode_images_per_s": decode,
        "dali_vs_paddle_dataloader": decode["dali_cpu"] / decode["paddle_dataloader_pil"],
        "sizes": {"images": args.images, "mean_jpeg_bytes": jpeg_bytes, "image_size": [500, 375],
                  "decoded_bytes_per_sample": settings["resize"] ** 2 * 3, "crop": settings["crop"],
                  "batch_per_rank": settings["batch"], "ranks": 2, "nodes": 1,
                  "bandwidth_MBps": args.bandwidth_MBps, "latency_ms": args.latency_ms,
                  "memory_cache_MB": settings["memory_cache_MB"], "rounds": args.rounds, "threads": args.threads,
                  "digits": 1797},
        "foreign_load": foreign,
        "load_average_1_5_15_min": {"start": load_at_start, "end": os.getloadavg()},
        "raw": ranks,
    }
    print(json.dumps({k: v for k, v in report.items() if k != "raw"}, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)


if __name__ == "__main__":
    main()
