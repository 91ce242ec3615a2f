"""One rank of a gradient-sync contender on ResNet-50's 161 parameter shapes (97.5 MiB fp32).

    python -m benchmarks.gradsync.gradsync_worker CONTENDER      (started by gradsync.py, one process per rank)

fleetlite_<size>mb contenders run the copy-free buckets (on CPU, where the kernels build),
fleetlite_concat_<size>mb the concat/split buckets of before. Contenders that sync inside backward (fleetlite, DataParallel, DDP) report the paired difference
t(step with sync) - t(the same step without sync, same process), i.e. the sync cost that remains.
"""
import json
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.harness.worker_loop import serve

SHAPES_FILE = Path(__file__).parents[1] / "harness" / "resnet50_shapes.json"
SHAPES = [tuple(s) for s in json.loads(SHAPES_FILE.read_text())["shapes"]]
NUMEL = sum(int(np.prod(s)) for s in SHAPES)


def timed(function):
    started = time.perf_counter()
    function()
    return (time.perf_counter() - started) * 1000.0


# --- Paddle ---------------------------------------------------------------------------------
def paddle_barrier():
    from paddle.distributed import collective
    return lambda: collective._get_default_group().process_group.barrier().wait()


def paddle_static_collectives(per_tensor):
    """Raw static all_reduce_: one per tensor, or one over a pre-packed flat buffer (the limit)."""
    import paddle
    import paddle.distributed as dist
    dist.init_parallel_env()
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        shapes = SHAPES if per_tensor else [(NUMEL,)]
        buffers = [paddle.static.create_parameter(list(s), "float32") for s in shapes]
        for buffer in buffers:
            paddle._C_ops.all_reduce_(buffer, 0, 0)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    return (lambda: exe.run(main)), paddle_barrier()


def fleetlite_fused(size_mb, copy_free=True, loss_scaled=False):
    """fleetlite's compiled training step, minus the same step compiled for one process.

    `size_mb`: a bucket size in MiB, "unfused", or "cpu_preset" (configs/cpu_gloo.yaml).
    `copy_free=False` keeps the concat/split buckets fleetlite emitted before the copy-free ones
    (the copy_free_buckets pass reports itself skipped). Both programs of the pair keep their
    gradients persistable, as the copy-free one must (and as DDP's pair keeps its .grad tensors), so
    the difference measures the sync, not the allocation of gradients the plain step would do.
    `loss_scaled` puts the 1/N on the loss gradient (gradient_scale_configs.scale_gradient), so
    the copy-free pack does not touch the bytes at all.
    Returns (step, barrier, info): info is what the bucket kernels found in place so far."""
    import paddle
    import fleetlite as fleet
    from fleetlite.compile import bucket_views
    from fleetlite.strategies import copy_free_buckets
    if not copy_free:
        copy_free_buckets.CopyFreeBuckets.applicable = lambda self, topology, program: "the concat/split contender"
    paddle.enable_static()
    fleet.init(is_collective=True)
    strategy = fleet.DistributedStrategy()
    if size_mb == "cpu_preset":
        strategy = fleet.DistributedStrategy.load(Path(__file__).parents[2] / "configs" / "cpu_gloo.yaml")
    elif size_mb == "unfused":
        strategy.fuse_all_reduce_ops = False
    else:
        strategy.fuse_grad_size_in_MB = int(size_mb)
        strategy.fuse_grad_size_in_TFLOPS = 0
        strategy.last_comm_group_size_MB = 0
    if loss_scaled:
        strategy.gradient_scale_configs.scale_gradient = True

    def build(distributed):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard(
                "dist_" if distributed else "plain_"):
            params = [paddle.static.create_parameter(list(s), "float32") for s in SHAPES]
            loss = paddle.add_n([p.sum() for p in params])
            optimizer = paddle.optimizer.SGD(0.0)
            if distributed:
                optimizer = fleet.distributed_optimizer(optimizer, strategy)
            _, params_grads = optimizer.minimize(loss)
            if not distributed:
                for _, grad in params_grads:
                    grad.persistable = True
        exe.run(startup)
        return main

    exe = paddle.static.Executor(paddle.CPUPlace())
    synced, plain = build(True), build(False)
    barrier = fleet.barrier_worker

    def step():
        baseline = timed(lambda: exe.run(plain))
        barrier()
        return timed(lambda: exe.run(synced)) - baseline

    def info():
        return bucket_views.counts() if copy_free and bucket_views.load_error() is None else None
    return step, barrier, info


def paddle_dataparallel():
    """Paddle dygraph DataParallel (defaults: 25 MB buckets, last 1 MB), minus plain backward."""
    import paddle
    import paddle.distributed as dist
    dist.init_parallel_env()

    class Shapes(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.tensors = paddle.nn.ParameterList(
                [paddle.create_parameter(list(s), "float32") for s in SHAPES])

        def forward(self):
            return paddle.add_n([p.sum() for p in self.tensors])

    plain, wrapped = Shapes(), paddle.DataParallel(Shapes())

    def backward(module):
        module().backward()
        for p in module.parameters():
            p.clear_gradient(False)
    barrier = paddle_barrier()

    def step():
        baseline = timed(lambda: backward(plain))
        barrier()
        return timed(lambda: backward(wrapped)) - baseline
    return step, barrier


# --- PyTorch ---------------------------------------------------------------------------------
def torch_init():
    import torch
    import torch.distributed as tdist
    torch.set_num_threads(1)
    tdist.init_process_group("gloo")
    return torch, tdist


def torch_flat():
    torch, tdist = torch_init()
    buffer = torch.zeros(NUMEL)
    return (lambda: tdist.all_reduce(buffer)), tdist.barrier


def torch_ddp():
    """PyTorch DDP (defaults: 25 MB buckets), minus the same backward without DDP."""
    torch, tdist = torch_init()

    class Shapes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tensors = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES])

        def forward(self):
            return sum(p.sum() for p in self.tensors)

    plain = Shapes()
    wrapped = torch.nn.parallel.DistributedDataParallel(Shapes())

    def backward(module):
        module().backward()
        module.zero_grad(set_to_none=False)

    def step():
        baseline = timed(lambda: backward(plain))
        tdist.barrier()
        return timed(lambda: backward(wrapped)) - baseline
    return step, tdist.barrier


CONTENDERS = {
    "paddle_flat_limit": lambda: paddle_static_collectives(per_tensor=False),
    "paddle_static_per_tensor": lambda: paddle_static_collectives(per_tensor=True),
    "paddle_dataparallel": paddle_dataparallel,
    "torch_flat": torch_flat,
    "torch_ddp": torch_ddp,
}


def make(name):
    """(step, barrier[, info]) of contender `name`: fleetlite_<size>mb (copy-free buckets on CPU),
    fleetlite_concat_<size>mb (concat/split buckets), fleetlite_unfused, fleetlite_cpu_preset (each
    may end in _loss_scaled: 1/N on the loss gradient), or one of CONTENDERS."""
    if not name.startswith("fleetlite_"):
        return CONTENDERS[name]()
    size, loss_scaled = name.removesuffix("_loss_scaled"), name.endswith("_loss_scaled")
    concat = size.startswith("fleetlite_concat_")
    size = size.removeprefix("fleetlite_concat_").removeprefix("fleetlite_").removesuffix("mb")
    return fleetlite_fused(size, copy_free=not concat, loss_scaled=loss_scaled)


if __name__ == "__main__":
    serve(*make(sys.argv[1]))
