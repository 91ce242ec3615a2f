"""One rank of a dygraph training-step contender, 20 steps per sample, SGD.

    python dygraph_step_worker.py CONTENDER MODEL BATCH_PER_RANK     (started by dygraph_step.py)

CONTENDER: train_step (fleet.train_step, cpu_gloo.yaml preset) or paddle_dataparallel (the eager
loop on paddle.DataParallel). MODEL: mlp (the step-overhead MLP 64-512-512-10) or conv (two
conv + batch-norm blocks on 1x16x16 images, 10 classes). The train_step contender answers "info"
with its first call's time (trace + compile + startup + one step), in ms.
"""
import os
import sys
import time

import numpy as np

from step_worker import STEPS, data, mlp
from worker_loop import serve

IMAGE = (1, 16, 16)


def conv(nn):
    return nn.Sequential(nn.Conv2D(1, 16, 3, padding=1), nn.BatchNorm2D(16), nn.ReLU(), nn.MaxPool2D(2),
                         nn.Conv2D(16, 32, 3, padding=1), nn.BatchNorm2D(32), nn.ReLU(), nn.MaxPool2D(2),
                         nn.Flatten(), nn.Linear(32 * 4 * 4, 10))


def conv_data(batch):
    rng = np.random.RandomState(0)
    return rng.rand(batch, *IMAGE).astype("float32"), rng.randint(0, 10, (batch, 1)).astype("int64")


MODELS = {"mlp": (mlp, data), "conv": (conv, conv_data)}


def loss_fn(model, x, y):
    import paddle
    return paddle.nn.functional.cross_entropy(model(x), y)


def train_step(model_name, batch):
    import paddle
    import fleetlite as fleet
    paddle.base.core.set_num_threads(1)
    fleet.init(is_collective=True, strategy=fleet.DistributedStrategy.load("../configs/cpu_gloo.yaml"))
    build, make_data = MODELS[model_name]
    model = fleet.distributed_model(build(paddle.nn))
    step = fleet.train_step(model, loss_fn, paddle.optimizer.SGD(0.01, parameters=model.parameters()))
    xs, ys = make_data(batch)
    started = time.perf_counter()
    float(step(xs, ys))
    first_call_ms = (time.perf_counter() - started) * 1000.0

    def run():
        for _ in range(STEPS):
            loss = step(xs, ys)
        float(loss)
    return run, fleet.barrier_worker, lambda: {"first_call_ms": first_call_ms}


def paddle_dataparallel(model_name, batch):
    import paddle
    import paddle.distributed as dist
    from paddle.distributed import collective
    paddle.base.core.set_num_threads(1)
    world = int(os.environ["PADDLE_TRAINERS_NUM"])
    if world > 1:
        dist.init_parallel_env()
    build, make_data = MODELS[model_name]
    model = build(paddle.nn)
    model = paddle.DataParallel(model) if world > 1 else model
    optimizer = paddle.optimizer.SGD(0.01, parameters=model.parameters())
    xs, ys = (paddle.to_tensor(a) for a in make_data(batch))

    def run():
        for _ in range(STEPS):
            loss = loss_fn(model, xs, ys)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
        float(loss)
    barrier = (lambda: collective._get_default_group().process_group.barrier().wait()) if world > 1 else (lambda: None)
    return run, barrier, None


CONTENDERS = {"train_step": train_step, "paddle_dataparallel": paddle_dataparallel}

if __name__ == "__main__":
    serve(*CONTENDERS[sys.argv[1]](sys.argv[2], int(sys.argv[3])))
