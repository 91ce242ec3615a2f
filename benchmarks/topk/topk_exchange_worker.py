"""One rank of a gradient-exchange contender: an MLP trained by fleetlite with one exchange.

    python -m benchmarks.topk.topk_exchange_worker EXCHANGE LAYERS BATCH [CLOCK]   (started by topk_wire_bytes.py
                                                             and topk_throttled.py, one process per rank)

EXCHANGE names an entry of topk_contenders.EXCHANGES; LAYERS the MLP's widths, comma-separated
(input first, 10 classes last); BATCH the rows per rank. Each rank trains on its own fixed random
batch (the gradients differ between ranks, as in training). A step is one training step; "info"
answers the bytes per step this rank should send (the exchange's formula; null when it has none)
and the parameter count. CLOCK `cpu` makes a step report the CPU time this process spent in it
(all its threads, in ms) instead of its wall time: what the exchange costs in computation, which a
loaded machine inflates far less than wall time (gloo sleeps while it waits for the link). A `one_by_one` contender replaces the topk pass's bucket_refusal, so its
program exchanges each gradient on its own (the path before CPU buckets), for a side-by-side measure.
"""
import sys
import time

import numpy as np
import paddle

import fleetlite as fleet
from benchmarks.topk.topk_contenders import exchange
from fleetlite.strategies import topk_exchange
from benchmarks.harness.worker_loop import serve


def build(layers, strategy):
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, layers[0]], "float32")
        label = paddle.static.data("label", [None, 1], "int64")
        blocks = []
        for width, following in zip(layers[:-1], layers[1:]):
            blocks += [paddle.nn.Linear(width, following), paddle.nn.ReLU()]
        loss = paddle.nn.functional.cross_entropy(paddle.nn.Sequential(*blocks[:-1])(x), label)
        optimizer = fleet.distributed_optimizer(paddle.optimizer.Momentum(0.01, momentum=0.9), strategy)
        optimizer.minimize(loss)
    return main, startup, loss, optimizer.compile_report


def cpu_ms(step):
    started = time.process_time()
    step()
    return (time.process_time() - started) * 1000.0


def main(name, layers, batch, clock="wall"):
    paddle.enable_static()
    fleet.init(is_collective=True)
    contender = exchange(name)
    if contender.one_by_one:
        topk_exchange.bucket_refusal = lambda *_: "measured one by one (benchmarks/topk one_by_one)"
    widths = [int(w) for w in layers.split(",")]
    main_program, startup, loss, report = build(widths, contender.strategy())
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    rng = np.random.default_rng(fleet.worker_index())
    feed = {"x": rng.standard_normal((int(batch), widths[0])).astype("float32"),
            "label": rng.integers(0, widths[-1], (int(batch), 1)).astype("int64")}
    parameters = sum(width * following + following for width, following in zip(widths[:-1], widths[1:]))
    predicted = contender.formula(report, fleet.worker_num()) if contender.formula else None

    def step():
        exe.run(main_program, feed=feed, fetch_list=[loss])

    serve(step if clock == "wall" else lambda: cpu_ms(step), fleet.barrier_worker,
          lambda: {"predicted_bytes_per_rank": predicted, "parameters": parameters})


if __name__ == "__main__":
    main(*sys.argv[1:])
