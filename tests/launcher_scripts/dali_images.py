"""The DALI CPU loader feeding a data-parallel static program, for tests/data/test_data_dali.py.

Each rank builds `fleetlite.data.image_loader(LIST, strategy, batch)` with loader "dali" and
trains a linear classifier on it (a gradient all-reduce per step, so unequal batch counts would
hang) for two epochs per equal_batches policy, recording the labels (each image's label is its
index) and shapes of every batch; then two epochs with the cache levels on (DALI augmenting what
the node's shared cache delivers), with the cache's hit and miss counts. Then it runs the
evaluation pipeline (resize + centre crop, no flip) once and saves every image it decoded, by
label, for the test to compare with PIL; and two evaluation epochs of each loader (DALI, DALI
after the cache, Paddle), recording every batch's labels: evaluation must see each sample once.
Writes OUT/result.RANK.json and OUT/eval.RANK.npz.
"""
import argparse
import json
import os

import numpy as np
import paddle

import fleetlite as fleet
import fleetlite.data


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--list", required=True)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--crop", type=int, default=32)
    parser.add_argument("--resize", type=int, default=40)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    paddle.enable_static()
    strategy = fleet.DistributedStrategy()
    strategy.data_configs = {"loader": "dali", "cache_dir": os.path.join(args.out, "cache")}
    fleet.init(is_collective=True, strategy=strategy)
    paddle.seed(0)
    main_program, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main_program, startup):
        image = paddle.static.data("image", [None, 3, args.crop, args.crop], "float32")
        label = paddle.static.data("label", [None, 1], "int64")
        logits = paddle.nn.Linear(3 * args.crop * args.crop, 64)(paddle.flatten(image, 1))
        loss = paddle.nn.functional.cross_entropy(logits, label)
        fleet.distributed_optimizer(paddle.optimizer.SGD(0.01), strategy).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)

    result = {"rank": fleet.worker_index(), "epochs": {}}
    for policy in ("pad", "drop"):
        strategy.data_configs.equal_batches = policy
        batches = fleetlite.data.image_loader(args.list, strategy, args.batch, crop=args.crop, resize=args.resize)
        for epoch in range(2):
            seen = []
            for images, labels in batches:
                exe.run(main_program, feed={"image": images, "label": labels}, fetch_list=[loss])
                seen.append({"labels": labels.ravel().tolist(), "shape": list(images.shape),
                             "dtype": str(images.dtype), "label_dtype": str(labels.dtype)})
            result["epochs"][f"{policy}/{epoch}"] = seen

    strategy.data_configs.equal_batches = "pad"
    strategy.data_configs.cache_levels = ["disk", "memory"]
    batches = fleetlite.data.image_loader(args.list, strategy, args.batch, crop=args.crop, resize=args.resize)
    for epoch in range(2):
        seen = []
        for images, labels in batches:
            exe.run(main_program, feed={"image": images, "label": labels}, fetch_list=[loss])
            seen.append({"labels": labels.ravel().tolist(), "shape": list(images.shape), "dtype": str(images.dtype),
                         "label_dtype": str(labels.dtype)})
        result["epochs"][f"cached/{epoch}"] = seen
    batches.close()
    result["cache_stats"] = [batches.dataset.stats(epoch) for epoch in range(2)]
    strategy.data_configs.cache_levels = []
    decoded = {}
    for images, labels in fleetlite.data.image_loader(args.list, strategy, args.batch, crop=args.crop,
                                                      resize=args.resize, training=False):
        for picture, name in zip(images, labels.ravel()):
            decoded[str(name)] = picture
    np.savez(os.path.join(args.out, f"eval.{result['rank']}.npz"), **decoded)
    result["evaluation"] = {}
    for name, loader, levels in (("dali", "dali", []), ("dali cached", "dali", ["disk", "memory"]),
                                 ("paddle", "paddle", [])):
        strategy.data_configs.loader, strategy.data_configs.cache_levels = loader, levels
        batches = fleetlite.data.image_loader(args.list, strategy, args.batch, crop=args.crop, resize=args.resize,
                                              training=False)
        result["evaluation"][name] = [[labels.ravel().tolist() for _, labels in batches] for _ in range(2)]
        if levels:
            batches.close()
    with open(os.path.join(args.out, f"result.{result['rank']}.json"), "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main()
