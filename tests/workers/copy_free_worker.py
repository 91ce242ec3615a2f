"""Train the conv + batch-norm net in one copy-free bucket for a few steps; report what the bucket
kernels found in place after each step, and what saving wrote.

Usage: copy_free_worker.py SAVE_FOLDER
"""
import os
import sys
from pathlib import Path

import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from fleetlite.compile import bucket_views  # noqa: E402
from support.multiprocess import write_result  # noqa: E402
from support import models  # noqa: E402

ROWS, STEPS = 8, 3


def main():
    save_folder = Path(sys.argv[1])
    paddle.enable_static()
    fleet.init(is_collective=True)
    strategy = fleet.DistributedStrategy()
    strategy.fuse_grad_size_in_MB, strategy.fuse_grad_size_in_TFLOPS, strategy.last_comm_group_size_MB = 64, 0, 0
    main_program, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main_program, startup):
        x = paddle.static.data("x", [ROWS, 64], "float32")
        y = paddle.static.data("y", [ROWS, 1], "int64")
        loss = models.loss("convbn", x, y, 1)
        optimizer = fleet.distributed_optimizer(paddle.optimizer.Momentum(0.1, momentum=0.9), strategy)
        optimizer.minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    x_all, y_all = models.digits(ROWS * STEPS * fleet.worker_num())
    counts = []
    for step in range(STEPS):
        start = (step * fleet.worker_num() + fleet.worker_index()) * ROWS
        exe.run(main_program, feed={"x": x_all[start:start + ROWS], "y": y_all[start:start + ROWS]})
        counts.append(bucket_views.counts())
    fleet.save_persistables(exe, str(save_folder / "checkpoint"), main_program)
    fleet.save_inference_model(exe, str(save_folder / "inference"), ["x", "y"], [loss], main_program)
    fleet.util.barrier()
    fleet.load_model(str(save_folder / "checkpoint"), main_program=main_program)
    report = optimizer.compile_report
    write_result({"counts": counts, "buckets": report.buckets, "members": len(report.buckets[0]["gradients"]),
                  "saved": sorted(os.listdir(save_folder / "checkpoint")),
                  "inference": (save_folder / "inference" / "model.json").read_text()})


if __name__ == "__main__":
    main()
