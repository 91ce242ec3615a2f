"""The digits MLP trained data parallel on deliberately uneven data, for tests/data/test_data_processes.py.

Rank 0 reads two record files and rank 1 one (shard_files by="file"), then both read the 1797
digits (odd) through DistributedBatchSampler: for each --policies entry (data_configs.
equal_batches) every rank trains one epoch of each, a gradient all-reduce per step, so unequal
batch counts would hang. Then the digits are evaluated with the evaluation sampler on every
rank and summed with all_reduce_sums; rank 0 also evaluates them alone, in one batch. Each
rank writes its counts and accuracies to OUT/result.RANK.json.
"""
import argparse
import json
import os

import numpy as np
import paddle
from sklearn.datasets import load_digits

import fleetlite as fleet
import fleetlite.data


class Digits(paddle.io.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def as_example(sample):
    return (sample["npy"].reshape(64) / 16.0).astype("float32"), np.array([sample["cls"]], dtype="int64")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", required=True)
    parser.add_argument("--policies", default="pad,drop")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    paddle.enable_static()
    strategy = fleet.DistributedStrategy()
    fleet.init(is_collective=True, strategy=strategy)
    paddle.seed(0)
    main_program, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main_program, startup):
        x = paddle.static.data("x", [None, 64], "float32")
        label = paddle.static.data("label", [None, 1], "int64")
        logits = paddle.nn.Sequential(paddle.nn.Linear(64, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 10))(x)
        loss = paddle.nn.functional.cross_entropy(logits, label)
        mapping = paddle.pir.IrMapping()
        test_program = main_program.clone(mapping)
        test_logits = mapping.look_up(logits)
        fleet.distributed_optimizer(paddle.optimizer.Momentum(0.05, momentum=0.9), strategy).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    digits = load_digits()
    everything = Digits((digits.data / 16.0).astype("float32"), digits.target.astype("int64").reshape(-1, 1))

    result = {"rank": fleet.worker_index(), "steps": {}}
    for policy in args.policies.split(","):
        strategy.data_configs.equal_batches = policy
        shard = fleetlite.data.shard_files(args.records, by="file", transform=as_example)
        for name, dataset in (("records", shard), ("digits", everything)):
            batches = fleetlite.data.loader(dataset, strategy, 16)
            steps = 0
            for xs, labels in batches:
                exe.run(main_program, feed={"x": xs, "label": labels}, fetch_list=[loss])
                steps += 1
            sampler = batches.batch_sampler
            result["steps"][f"{policy}/{name}"] = [steps, sampler.padded, sampler.dropped]

    correct = seen = 0
    for xs, labels in fleetlite.data.loader(everything, strategy, 25, evaluation=True):
        (scores,) = exe.run(test_program, feed={"x": xs, "label": labels}, fetch_list=[test_logits])
        correct += int((scores.argmax(axis=1) == np.array(labels)[:, 0]).sum())
        seen += len(scores)
    result["own"] = seen
    result["correct"], result["seen"] = fleetlite.data.all_reduce_sums([correct, seen]).tolist()
    if fleet.worker_index() == 0:
        (scores,) = exe.run(test_program, feed={"x": everything.x, "label": everything.y}, fetch_list=[test_logits])
        result["one_process_correct"] = int((scores.argmax(axis=1) == digits.target).sum())
    with open(os.path.join(args.out, f"result.{fleet.worker_index()}.json"), "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main()
