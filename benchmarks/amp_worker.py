"""One process of an AMP contender: a conv net or the step benchmark's MLP, trained by fleetlite in
float32 or with bfloat16 O1 AMP, 10 steps per sample.

    python amp_worker.py MODEL PRECISION BATCH     (started by amp_bf16.py; MODEL: convnet | mlp)
"""
import sys

import numpy as np

from step_worker import SIZES, data, mlp
from worker_loop import serve

STEPS = 10
IMAGE = (3, 32, 32)


def convnet(nn):
    """conv-bn-relu twice, max pooling, a linear classifier: the shape of a small image model."""
    return nn.Sequential(nn.Conv2D(3, 32, 3, padding=1), nn.BatchNorm2D(32), nn.ReLU(), nn.MaxPool2D(2),
                         nn.Conv2D(32, 64, 3, padding=1), nn.BatchNorm2D(64), nn.ReLU(), nn.MaxPool2D(2),
                         nn.Flatten(), nn.Linear(64 * 8 * 8, 10))


def images(batch):
    rng = np.random.RandomState(0)
    return rng.rand(batch, *IMAGE).astype("float32"), rng.randint(0, 10, (batch, 1)).astype("int64")


def contender(model, precision, batch):
    import paddle
    import fleetlite as fleet
    paddle.enable_static()
    paddle.base.core.set_num_threads(1)
    fleet.init(is_collective=True)
    strategy = fleet.DistributedStrategy()
    if precision == "bf16_o1":
        strategy.amp = True
        strategy.amp_configs = {"dtype": "bfloat16"}
    shape, build, feed = ((SIZES[0],), mlp, data) if model == "mlp" else (IMAGE, convnet, images)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, *shape], "float32")
        y = paddle.static.data("y", [None, 1], "int64")
        loss = paddle.nn.functional.cross_entropy(build(paddle.nn)(x), y)
        fleet.distributed_optimizer(paddle.optimizer.SGD(0.01), strategy).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    xs, ys = feed(batch)

    def step():
        for _ in range(STEPS):
            exe.run(main, feed={"x": xs, "y": ys}, fetch_list=[loss])
    return step, lambda: None


if __name__ == "__main__":
    serve(*contender(sys.argv[1], sys.argv[2], int(sys.argv[3])))
