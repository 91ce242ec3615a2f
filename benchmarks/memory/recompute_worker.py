"""One process of the recompute benchmark: a deep MLP (LAYERS blocks of Linear + tanh) trained by
fleetlite with or without recompute (a checkpoint every EVERY blocks, by layer name), one step
per sample; its "info" answer is the memory it measured.

    python -m benchmarks.memory.recompute_worker CONFIG LAYERS WIDTH BATCH EVERY   (CONFIG: plain | recompute)

Memory comes from Paddle's CPU allocator statistics (`host_memory_stat_*_value("Allocated", 0)`):
the peak of bytes allocated, and the bytes held before the first step (parameters, inputs), so
the activations' share of the peak is their difference. The process's RSS high-water mark
(`resource.getrusage`) is reported beside it.
"""
import resource
import sys

import numpy as np

from benchmarks.harness.worker_loop import serve


def checkpoints(layers, every):
    """Layer names of every `every`-th block's Linear, the last block excepted."""
    return [f"linear_{i}" for i in range(every - 1, layers - 1, every)]


def contender(config, layers, width, batch, every):
    import paddle
    import fleetlite as fleet
    paddle.enable_static()
    paddle.base.core.set_num_threads(1)
    fleet.init(is_collective=True)
    strategy = fleet.DistributedStrategy()
    if config == "recompute":
        strategy.recompute = True
        strategy.recompute_configs = {"checkpoints": checkpoints(layers, every)}
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [batch, width], "float32")
        h = x
        for _ in range(layers):
            h = paddle.tanh(paddle.nn.Linear(width, width)(h))
        loss = paddle.mean(h * h)
        fleet.distributed_optimizer(paddle.optimizer.SGD(0.01), strategy).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    feed = {"x": np.random.RandomState(0).rand(batch, width).astype("float32")}
    exe.run(main, feed=feed, fetch_list=[loss])     # the executor's own buffers, before measuring
    stats = paddle.base.core
    held = stats.host_memory_stat_current_value("Allocated", 0)
    stats.host_memory_stat_reset_peak_value("Allocated", 0)
    exe.run(main, feed=feed, fetch_list=[loss])
    peak = stats.host_memory_stat_peak_value("Allocated", 0)

    def step():
        exe.run(main, feed=feed, fetch_list=[loss])

    def info():
        return {"peak_allocated": peak, "held_before_step": held, "activations": peak - held,
                "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "recomputed_ops": sum(1 for op in main.global_block().ops
                                      if op.has_attr("fleetlite_pass") and op.str_attr("fleetlite_pass") == "recompute")}
    return step, fleet.barrier_worker, info


if __name__ == "__main__":
    serve(*contender(sys.argv[1], *map(int, sys.argv[2:6])))
