"""One rank of a training-step contender: MLP 64-512-512-10, SGD, 20 steps per sample.

    python -m benchmarks.step_overhead.step_worker CONTENDER BATCH_PER_RANK     (started by step_overhead.py)
"""
import sys

import numpy as np

from benchmarks.harness.worker_loop import serve

STEPS = 20
SIZES = (64, 512, 512, 10)


def mlp(nn):
    """The benchmark model from `paddle.nn` or `torch.nn` (same Linear/ReLU/Sequential names)."""
    layers = []
    for i, (n_in, n_out) in enumerate(zip(SIZES, SIZES[1:])):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(SIZES) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def data(batch):
    rng = np.random.RandomState(0)
    return rng.rand(batch, SIZES[0]).astype("float32"), rng.randint(0, SIZES[-1], (batch, 1)).astype("int64")


def fleetlite_static(batch, model=mlp, sample_shape=(SIZES[0],), make_data=data, steps=STEPS, **strategy_fields):
    """`model` trained by fleetlite with the cpu_gloo.yaml preset plus `strategy_fields`, `steps`
    steps per sample."""
    import paddle
    import fleetlite as fleet
    paddle.enable_static()
    paddle.base.core.set_num_threads(1)
    fleet.init(is_collective=True)
    strategy = fleet.DistributedStrategy.load("configs/cpu_gloo.yaml")
    for name, value in strategy_fields.items():
        setattr(strategy, name, value)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, *sample_shape], "float32")
        y = paddle.static.data("y", [None, 1], "int64")
        loss = paddle.nn.functional.cross_entropy(model(paddle.nn)(x), y)
        fleet.distributed_optimizer(paddle.optimizer.SGD(0.01), strategy).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    xs, ys = make_data(batch)

    def step():
        for _ in range(steps):
            exe.run(main, feed={"x": xs, "y": ys}, fetch_list=[loss])
    return step, fleet.barrier_worker


def paddle_dataparallel(batch, model=mlp, make_data=data, steps=STEPS):
    """`model` trained by Paddle's eager loop on paddle.DataParallel (2+ processes)."""
    import paddle
    import paddle.distributed as dist
    from paddle.distributed import collective
    paddle.base.core.set_num_threads(1)
    world = int(__import__("os").environ["PADDLE_TRAINERS_NUM"])
    if world > 1:
        dist.init_parallel_env()
    model = model(paddle.nn)
    model = paddle.DataParallel(model) if world > 1 else model
    optimizer = paddle.optimizer.SGD(0.01, parameters=model.parameters())
    xs, ys = (paddle.to_tensor(a) for a in make_data(batch))

    def step():
        for _ in range(steps):
            loss = paddle.nn.functional.cross_entropy(model(xs), ys)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
        float(loss)
    barrier = (lambda: collective._get_default_group().process_group.barrier().wait()) if world > 1 else (lambda: None)
    return step, barrier


def torch_ddp(batch, model=mlp, make_data=data, steps=STEPS):
    """`model` in PyTorch, wrapped in DistributedDataParallel on more than one rank."""
    import os
    import torch
    import torch.distributed as tdist
    torch.set_num_threads(1)
    world = int(os.environ["WORLD_SIZE"])
    model = model(torch.nn)
    if world > 1:
        tdist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    xs, ys = (torch.from_numpy(a) for a in make_data(batch))
    ys = ys[:, 0]

    def step():
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(model(xs), ys)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        float(loss)
    return step, (tdist.barrier if world > 1 else (lambda: None))


CONTENDERS = {"fleetlite": fleetlite_static, "paddle_dataparallel": paddle_dataparallel, "torch_ddp": torch_ddp}

if __name__ == "__main__":
    serve(*CONTENDERS[sys.argv[1]](int(sys.argv[2])))
