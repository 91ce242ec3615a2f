"""One rank of a dygraph training-step contender, 20 steps per sample, SGD.

    python -m benchmarks.dygraph.dygraph_step_worker CONTENDER MODEL BATCH_PER_RANK     (started by dygraph_step.py)

CONTENDER: train_step (fleet.train_step, cpu_gloo.yaml preset) or paddle_dataparallel (the eager
loop on paddle.DataParallel, as in step_worker). MODEL: mlp (the step-overhead MLP 64-512-512-10)
or conv (amp_worker's conv net: two conv + batch-norm blocks on 3x32x32 images, 10 classes).
The train_step contender answers "info" with its first call's time (trace + compile + startup +
one step), in ms.
"""
import sys
import time

from benchmarks.step_overhead import step_worker
from benchmarks.amp.amp_worker import convnet, images
from benchmarks.step_overhead.step_worker import STEPS, data, mlp
from benchmarks.harness.worker_loop import serve

MODELS = {"mlp": (mlp, data), "conv": (convnet, images)}


def loss_fn(model, x, y):
    import paddle
    return paddle.nn.functional.cross_entropy(model(x), y)


def train_step(model_name, batch):
    import paddle
    import fleetlite as fleet
    paddle.base.core.set_num_threads(1)
    fleet.init(is_collective=True, strategy=fleet.DistributedStrategy.load("configs/cpu_gloo.yaml"))
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
    return step_worker.paddle_dataparallel(batch, *MODELS[model_name])


CONTENDERS = {"train_step": train_step, "paddle_dataparallel": paddle_dataparallel}

if __name__ == "__main__":
    serve(*CONTENDERS[sys.argv[1]](sys.argv[2], int(sys.argv[3])))
