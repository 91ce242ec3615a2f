"""Train a small conv net on a folder of images, data parallel, fed by `fleetlite.data.image_loader`.

    fleetrun --nproc_per_node 2 examples/train_images.py --images photos/ --cache         # PIL + the cache
    fleetrun --nproc_per_node 2 examples/train_images.py --images photos/ --loader dali   # DALI
    fleetrun --nproc_per_node 2 examples/train_images.py --images photos/ --loader dali --cache   # both

`photos/<class>/<image>.jpg` (or a DALI file list). With --cache the first epoch copies the files
to a local disk cache and keeps the decoded images in a shared-memory store per node; later
epochs read them from memory (with --loader dali too, DALI then augmenting what the cache
decoded). Each epoch prints its time, the time spent waiting for data and
(with the cache) this rank's hit and miss counts. Without --images, 64 synthetic JPEGs are written
to $TMPDIR/fleetlite_example_images first (--slow_MBps then throttles reads from it, as a network
file system would).
"""
import argparse
import os
import tempfile
import time

import numpy as np
import paddle

import fleetlite as fleet
import fleetlite.data


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", default=None, help="a class-folder tree or a DALI file list")
    parser.add_argument("--loader", default="paddle", choices=["paddle", "dali"])
    parser.add_argument("--cache", action="store_true", help="cache_levels: [disk, memory]")
    parser.add_argument("--cache_dir", default=os.path.join(tempfile.gettempdir(), "fleetlite_example_cache"))
    parser.add_argument("--memory_MB", type=int, default=512)
    parser.add_argument("--slow_MBps", type=float, default=None, help="throttle reads (synthetic images only)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=16, help="per rank")
    parser.add_argument("--crop", type=int, default=96)
    return parser.parse_args()


def synthetic_images(folder, count=64, classes=4):
    """The same JPEGs on every rank (a fixed seed), each written atomically, so ranks that share
    the folder may all write it."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(count):
        os.makedirs(os.path.join(folder, f"class{i % classes}"), exist_ok=True)
        tint = np.array([60 * (i % classes), 120, 255 - 60 * (i % classes)])
        picture = np.clip(tint + rng.normal(0, 40, (160, 200, 3)), 0, 255).astype("uint8")
        path = os.path.join(folder, f"class{i % classes}", f"{i:04d}.jpg")
        Image.fromarray(picture).save(f"{path}.{os.getpid()}.tmp", format="JPEG", quality=90)
        os.replace(f"{path}.{os.getpid()}.tmp", path)
    return folder


def conv_net(image, classes):
    features = paddle.nn.Sequential(
        paddle.nn.Conv2D(3, 16, 3, stride=2, padding=1), paddle.nn.ReLU(),
        paddle.nn.Conv2D(16, 32, 3, stride=2, padding=1), paddle.nn.ReLU(),
        paddle.nn.AdaptiveAvgPool2D(1), paddle.nn.Flatten())(image)
    return paddle.nn.Linear(32, classes)(features)


def main():
    args = parse_args()
    paddle.enable_static()
    strategy = fleet.DistributedStrategy()
    strategy.data_configs = {"loader": args.loader, "cache_dir": args.cache_dir, "memory_cache_MB": args.memory_MB,
                             "cache_levels": ["disk", "memory"] if args.cache else []}
    fleet.init(is_collective=True, strategy=strategy)
    images, source = args.images, None
    if images is None:
        images = synthetic_images(os.path.join(tempfile.gettempdir(), "fleetlite_example_images"))
        if args.slow_MBps:
            source = fleetlite.data.ThrottledSource(images, args.slow_MBps, latency_ms=5)
    classes = max(fleetlite.data.image_list(images)[2]) + 1

    main_program, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main_program, startup):
        image = paddle.static.data("image", [None, 3, args.crop, args.crop], "float32")
        label = paddle.static.data("label", [None, 1], "int64")
        loss = paddle.nn.functional.cross_entropy(conv_net(image, classes), label)
        fleet.distributed_optimizer(paddle.optimizer.Momentum(0.05, momentum=0.9), strategy).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)

    through_cache = args.loader == "paddle" or args.cache      # not DALI's own file reader
    extra = {"source": source} if through_cache else {}
    batches = fleetlite.data.image_loader(images, strategy, args.batch_size, crop=args.crop,
                                          resize=args.crop + args.crop // 7, **extra)
    for epoch in range(args.epochs):
        start, losses = time.perf_counter(), []
        for features, labels in batches:
            (value,) = exe.run(main_program, feed={"image": features, "label": labels}, fetch_list=[loss])
            losses.append(float(value))
        line = f"rank {fleet.worker_index()} epoch {epoch}: {time.perf_counter() - start:.2f} s, loss {np.mean(losses):.3f}"
        if through_cache:
            line += f", waited {batches.wait_s[epoch]:.2f} s for data"
            if args.cache:
                line += f", {batches.dataset.stats(epoch)}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
