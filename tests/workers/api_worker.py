"""Exercise the fleet API in a real job; report what each call returned.

Usage: api_worker.py init_after_static|init_before_static|minimize_only
Checks, per rank: the worker queries; barrier_worker in static mode (the last rank arrives
1 s late); an fp16 sum lowered for gloo (raw, gloo returns inf); the compile report printed
by minimize on rank 0 only. minimize_only goes straight from init to minimize (for the
explain-only mode, where minimize ends the script).
"""
import contextlib
import io
import sys
import time
from pathlib import Path

import numpy as np
import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from fleetlite.compile.pass_contract import CompileContext  # noqa: E402
from fleetlite.strategies.gloo_lowering import GlooLowering  # noqa: E402
from support.multiprocess import write_result  # noqa: E402
from support.models import loss  # noqa: E402


def lowered_fp16_sum(topology, rank):
    main = paddle.static.Program()
    with paddle.static.program_guard(main):
        x = paddle.static.data("x", [3], "float16")
        paddle._C_ops.all_reduce(x, 0, 0)
    context = CompileContext(main, fleet.DistributedStrategy(), topology, [])
    context.current_pass = GlooLowering.name
    GlooLowering(context.strategy).apply(context)
    total = main.global_block().ops[-1].result(0)
    exe = paddle.static.Executor(paddle.CPUPlace())
    return exe.run(main, feed={"x": np.full([3], rank + 1, "float16")}, fetch_list=[total])[0].tolist()


def minimize():
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [4, 64], "float32")
        y = paddle.static.data("y", [4, 1], "int64")
        optimizer = fleet.distributed_optimizer(paddle.optimizer.SGD(0.1))
        optimizer.minimize(loss("mlp", x, y, 1))
    return optimizer.compile_report


def main():
    if sys.argv[1] == "init_before_static":
        fleet.init(is_collective=True)
        paddle.enable_static()
    else:
        paddle.enable_static()
        fleet.init(is_collective=True)
    if sys.argv[1] == "minimize_only":
        minimize()
        write_result({})
        return
    rank, world = fleet.worker_index(), fleet.worker_num()
    result = {"worker_index": rank, "worker_num": world, "is_first_worker": fleet.is_first_worker(),
              "worker_endpoints": fleet.worker_endpoints(), "local_rank": fleet.local_rank(),
              "local_size": fleet.local_size(), "node_num": fleet.node_num()}
    if rank == world - 1:
        time.sleep(1)
    started = time.monotonic()
    fleet.barrier_worker()
    result["barrier_wait"] = time.monotonic() - started
    if world > 1:
        result["fp16_sum"] = lowered_fp16_sum(fleet.api._topology(), rank)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        report = minimize()
    result["printed_report"] = printed.getvalue().startswith("fleetlite compile report")
    result["applied"] = report.applied
    write_result(result)


if __name__ == "__main__":
    main()
