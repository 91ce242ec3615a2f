"""Train every (model, strategy) pair for a few steps on this rank's shard; report losses and
final trainable parameters (the parity tests compare them with one process on the full batch).

Usage: parity_worker.py SHARDS STRATEGIES_JSON
SHARDS is how many equal shards the full batch is cut into: the world size for real ranks,
the emulated world size for the one-process oracle (which then sees the whole batch).
"""
import json
import sys
from pathlib import Path

import numpy as np
import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from support.multiprocess import write_result  # noqa: E402
from support import models  # noqa: E402

BATCH, STEPS, SEED = 16, 4, 2024


def train(model_name, strategy_fields, shards, x_all, y_all):
    rank, world = fleet.worker_index(), fleet.worker_num()
    strategy = fleet.DistributedStrategy()
    for field, value in strategy_fields.items():
        setattr(strategy, field, value)
    rows = BATCH // world                     # this process's rows per step
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [rows, 64], "float32")
        y = paddle.static.data("y", [rows, 1], "int64")
        loss = models.loss(model_name, x, y, shards // world)
        optimizer = fleet.distributed_optimizer(paddle.optimizer.Momentum(0.1, momentum=0.9), strategy)
        _, params_grads = optimizer.minimize(loss)
    names = sorted(p.name for p, _ in params_grads)
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope):
        paddle.seed(SEED + rank)              # ranks differ until the startup broadcast
        exe.run(startup)
        losses = []
        for step in range(STEPS):
            start = step * BATCH + rank * rows
            feed = {"x": x_all[start:start + rows], "y": y_all[start:start + rows]}
            losses.append(float(exe.run(main, feed=feed, fetch_list=[loss])[0]))
        params = {n: np.array(scope.find_var(n).get_tensor()).ravel().tolist() for n in names}
    report = optimizer.compile_report
    return {"losses": losses, "params": params, "applied": report.applied,
            "skipped": {r.name: r.reason for r in report.records if r.status == "skipped"},
            "buckets": len(report.buckets)}


def main():
    shards, strategies = int(sys.argv[1]), json.loads(sys.argv[2])
    paddle.enable_static()
    fleet.init(is_collective=True)
    x_all, y_all = models.digits(BATCH * STEPS)
    results = {f"{model}/{name}": train(model, fields, shards, x_all, y_all)
               for name, fields in strategies.items() for model in models.MODELS}
    write_result(results)


if __name__ == "__main__":
    main()
