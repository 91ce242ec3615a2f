"""One rank of the accuracy benchmark's fleetlite job: trains the digits example's models, one
training per request, with any exchange of topk_contenders.EXCHANGES.

    python -m benchmarks.topk.topk_accuracy_worker      (started by topk_accuracy.py, one process per rank)

A "train" request {model, exchange, seed, epochs, count_bytes} builds examples/train_digits.py's
model in a fresh scope (parameters drawn from `seed`, the data order from data_configs.seed =
`seed`), trains it for `epochs` epochs of the example's global batch 64 with its Momentum(0.05,
0.9), and answers the test accuracy, the steps, the bytes per rank the exchange's formula predicts
per step and, with count_bytes (the job runs in a network namespace of its own), the bytes its
loopback carried per training step, both directions (read by rank 0 around the training loop).
"""
import sys
from pathlib import Path

import paddle

import fleetlite as fleet
import fleetlite.data
from benchmarks.harness.network_namespace import own_loopback_bytes
from benchmarks.topk.topk_contenders import exchange
from benchmarks.harness.worker_loop import answer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import train_digits  # noqa: E402

GLOBAL_BATCH = 64      # the example's defaults
LEARNING_RATE = 0.05
HIDDEN = 128


def train(request, data):
    contender = exchange(request["exchange"])
    strategy = contender.strategy(data_configs={"seed": request["seed"]})
    world = fleet.worker_num()
    x_train, x_test, y_train, y_test = data
    paddle.seed(request["seed"])
    with paddle.static.scope_guard(paddle.static.Scope()), paddle.utils.unique_name.guard():
        main, startup, test_program, loss, test_logits, report = train_digits.build(
            HIDDEN, LEARNING_RATE, strategy, request["model"])
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        batches = fleetlite.data.loader(train_digits.Digits(x_train, y_train), strategy, GLOBAL_BATCH // world,
                                        drop_last=True)
        fleet.barrier_worker()
        before = own_loopback_bytes() if request["count_bytes"] else None
        losses = [train_digits.run_epoch(exe, main, loss, batches) for _ in range(request["epochs"])]
        fleet.barrier_worker()
        after = own_loopback_bytes() if request["count_bytes"] else None
        accuracy, _ = train_digits.evaluate(exe, test_program, test_logits,
                                             train_digits.Digits(x_test, y_test), strategy)
    steps = sum(len(epoch) for epoch in losses)
    return {"accuracy": accuracy, "steps": steps, "final_loss": losses[-1][-1],
            "bytes_per_step": (after - before) / steps if before is not None else None,
            "predicted_bytes_per_rank": contender.formula(report, world) if contender.formula else None}


def main():
    paddle.enable_static()
    fleet.init(is_collective=True)
    data = train_digits.load_data()
    answer({"train": lambda request: train(request, data)})


if __name__ == "__main__":
    main()
