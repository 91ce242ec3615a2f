"""A small static fleetlite job for the step records, summary, progress line and timeline tests.

Every rank runs --steps training steps of a two-layer regression compiled by
fleet.distributed_optimizer (its own slice of the same global batch), and reports its loss and
step count through fleet.report_progress; rank 0 prints its last loss (the model starts from
paddle.seed(0), so two runs of one job print the same). --sleep_rank R --sleep_s S makes rank R spend S
seconds of host time before each step (a slow input pipeline): the straggler. --dygraph trains
the same model through fleet.train_step instead.
"""
import argparse
import time

import numpy as np
import paddle

import fleetlite as fleet

FEATURES, HIDDEN, GLOBAL_BATCH = 16, 32, 32


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--sleep_rank", type=int, default=-1)
    parser.add_argument("--sleep_s", type=float, default=0.0)
    parser.add_argument("--step_s", type=float, default=0.0, help="every rank sleeps this long after each step")
    parser.add_argument("--dygraph", action="store_true")
    parser.add_argument("--strategy", default=None, help="a strategy file")
    return parser.parse_args()


def batches(steps, rank, world):
    data = np.random.RandomState(0)
    mine = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    for _ in range(steps):
        x = data.randn(GLOBAL_BATCH, FEATURES).astype("float32")
        yield x[mine], x[mine].sum(axis=1, keepdims=True)


def model():
    return paddle.nn.Sequential(paddle.nn.Linear(FEATURES, HIDDEN), paddle.nn.ReLU(), paddle.nn.Linear(HIDDEN, 1))


def static_steps(strategy):
    paddle.enable_static()
    fleet.init(is_collective=True, strategy=strategy)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, FEATURES], "float32")
        y = paddle.static.data("y", [None, 1], "float32")
        loss = paddle.nn.functional.mse_loss(model()(x), y)
        fleet.distributed_optimizer(paddle.optimizer.SGD(0.01), strategy).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    return lambda x, y: exe.run(main, feed={"x": x, "y": y}, fetch_list=[loss])[0]


def dygraph_steps(strategy):
    fleet.init(is_collective=True, strategy=strategy)
    net = model()
    optimizer = fleet.distributed_optimizer(paddle.optimizer.SGD(0.01, parameters=net.parameters()), strategy)
    step = fleet.train_step(net, lambda m, x, y: paddle.nn.functional.mse_loss(m(x), y), optimizer)
    return lambda x, y: step(x, y).numpy()


def main():
    args = parse_args()
    paddle.seed(0)
    strategy = fleet.DistributedStrategy.load(args.strategy) if args.strategy else fleet.DistributedStrategy()
    step = (dygraph_steps if args.dygraph else static_steps)(strategy)
    rank, world = fleet.worker_index(), fleet.worker_num()
    fleet.report_progress(total_steps=args.steps)
    for x, y in batches(args.steps, rank, world):
        if rank == args.sleep_rank:
            time.sleep(args.sleep_s)
        loss = step(x, y)
        fleet.report_progress(loss=loss)
        time.sleep(args.step_s)
    print(f"rank {rank} trained {args.steps} steps, last loss {float(np.asarray(loss).reshape(-1)[0]):.8f}", flush=True)


if __name__ == "__main__":
    main()
