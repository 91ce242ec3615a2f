"""Train the scenarios of the AMP, fp16_allreduce and sync_batch_norm tests on this rank's shard;
report what their oracles compare: losses, every parameter (running statistics included) after
each step, the loss scale after each step, and, for float16 wires, each bucket as it left this
rank next to the reduced gradient the optimizer read.

Usage: numerics_worker.py WORLD SCENARIOS_JSON
WORLD is the job being emulated: real ranks get BATCH // WORLD rows of each step's batch, the
one-process oracle (worker_num() == 1) gets all of them. A scenario is
  {"model": "mlp"|"convbn", "strategy": {field: value}, "optimizer": "sgd"|"momentum"|"adam",
   "batch_norm_over": "shard"|"global", "poison": [rank, step] or null}
"shard" splits the loss into WORLD parts so the oracle normalises per shard like the ranks;
"global" normalises over the whole batch (the sync_batch_norm oracle). "poison" writes an inf
into the rows of that (emulated) rank at that step.
"""
import json
import sys
from pathlib import Path

import numpy as np
import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from fleetlite.compile import program_edit  # noqa: E402
from support.multiprocess import write_result  # noqa: E402
from support import models  # noqa: E402

BATCH, STEPS, SEED = 16, 4, 7
OPTIMIZERS = {"sgd": lambda: paddle.optimizer.SGD(0.1),
              "momentum": lambda: paddle.optimizer.Momentum(0.1, momentum=0.9),
              "adam": lambda: paddle.optimizer.Adam(0.01)}


def build(scenario, world):
    strategy = fleet.DistributedStrategy()
    for field, value in scenario["strategy"].items():
        setattr(strategy, field, value)
    rows = BATCH // fleet.worker_num()
    parts = 1 if scenario["batch_norm_over"] == "global" else world // fleet.worker_num()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [rows, 64], "float32")
        y = paddle.static.data("y", [rows, 1], "int64")
        loss = models.loss(scenario["model"], x, y, parts)
        optimizer = fleet.distributed_optimizer(OPTIMIZERS[scenario["optimizer"]](), strategy)
        _, params_grads = optimizer.minimize(loss)
    return main, startup, loss, params_grads, optimizer.compile_report


def leaving_buckets(main):
    """Each float16-wire bucket as it leaves this rank (what fp16_allreduce narrows), in issue order."""
    casts = program_edit.created_by(main.global_block(), "fp16_allreduce")
    return [op.operand_source(0) for op in casts if op.name() == "pd_op.cast" and op.result(0).dtype == paddle.float16]


def train(scenario, world, x_all, y_all):
    rank = fleet.worker_index()
    main, startup, loss, params_grads, report = build(scenario, world)
    scale = report.record("amp").details.get("loss_scaling") if "amp" in report.applied else None
    names = sorted(op.str_attr("parameter_name") for op in main.global_block().ops if op.name() == "builtin.parameter")
    synced = {p.name: g for p, g in params_grads}
    local = leaving_buckets(main)
    rows = BATCH // fleet.worker_num()
    exe, scope = paddle.static.Executor(paddle.CPUPlace()), paddle.static.Scope()
    result = {"losses": [], "params": [], "scales": [], "local": [], "synced": [], "applied": report.applied,
              "buckets": [b["gradients"] for b in report.buckets]}
    with paddle.static.scope_guard(scope):
        paddle.seed(SEED + rank)              # ranks differ until the startup broadcast
        exe.run(startup)
        for step in range(STEPS):
            start = step * BATCH + rank * rows
            x, y = x_all[start:start + rows].copy(), y_all[start:start + rows]
            poison = scenario.get("poison")
            if poison and poison[1] == step:
                x[_rows_of(poison[0], world, rank, rows)] = np.inf
            fetched = exe.run(main, feed={"x": x, "y": y}, fetch_list=[loss, *local, *synced.values()])
            result["losses"].append(float(fetched[0]))
            result["local"].append([a.tolist() for a in fetched[1:1 + len(local)]])
            result["synced"].append({n: a.tolist() for n, a in zip(synced, fetched[1 + len(local):])})
            result["params"].append({n: np.array(scope.find_var(n).get_tensor()).ravel().tolist() for n in names})
            if scale:
                result["scales"].append(float(np.array(scope.find_var(scale).get_tensor())[0]))
    return result


def _rows_of(poisoned_rank, world, rank, rows):
    """The rows of this process's batch that belong to `poisoned_rank` of the emulated job."""
    per_rank = BATCH // world
    first = poisoned_rank * per_rank - rank * rows
    return slice(max(first, 0), max(min(first + per_rank, rows), 0))


def main():
    world, scenarios = int(sys.argv[1]), json.loads(sys.argv[2])
    paddle.enable_static()
    fleet.init(is_collective=True)
    x_all, y_all = models.digits(BATCH * STEPS)
    write_result({name: train(scenario, world, x_all, y_all) for name, scenario in scenarios.items()})


if __name__ == "__main__":
    main()
