"""Build and train one program per case (a strategy made of two knobs) in this process, a few
micro-steps each; report losses, final trainable parameters, what the compiler did and whether
the program keeps Paddle's invariants for persistable values (support/program_state.py), or the
conflict error the combination raised (any other compile error is reported for that case alone).

Usage: knob_pairs_worker.py WORLD CASES_JSON
WORLD is the job being emulated: a real rank feeds BATCH // WORLD rows of each step's batch, the
one-process oracle (worker_num() == 1) all of them. The model has batch norm: each case
normalises per shard like the ranks do, or over the whole batch when sync_batch_norm is on.
Flags a case sets (threads, sequential run, in-place) are restored before the next case.
"""
import json
import sys
from pathlib import Path

import numpy as np
import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from fleetlite import CompileError, StrategyConflictError  # noqa: E402
from support.multiprocess import write_result  # noqa: E402
from support import models, program_state  # noqa: E402

BATCH, MICRO_STEPS, SEED = 8, 4, 11
EXECUTOR_FLAGS = ("FLAGS_new_executor_serial_run", "FLAGS_new_executor_sequential_run", "FLAGS_pir_apply_inplace_pass")


def make_strategy(fields):
    strategy = fleet.DistributedStrategy()
    for field, value in fields.items():
        setattr(strategy, field, value)
    return strategy


def make_optimizer(strategy):
    """Adam where the case fuses optimizer ops (only Adam has a multi-tensor kernel) or turns lamb on
    (it rewrites an Adam update), else Momentum (lars rewrites a Momentum update; local SGD runs
    SGD or Momentum only).

    Adam's epsilon is large so that near-zero gradients (noise-level differences between
    summation orders) cannot flip the sign of an update.
    """
    momentum_only = strategy.lars or strategy.localsgd or strategy.adaptive_localsgd
    if strategy.lamb or (strategy.build_strategy.fuse_all_optimizer_ops and not momentum_only):
        return paddle.optimizer.Adam(0.001, epsilon=1e-3)
    return paddle.optimizer.Momentum(0.05, momentum=0.9)


def train(fields, world, x_all, y_all):
    rank, ranks = fleet.worker_index(), fleet.worker_num()
    strategy = make_strategy(fields)
    rows = BATCH // ranks
    parts = 1 if strategy.sync_batch_norm else world // ranks
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    try:
        with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [rows, 64], "float32")
            y = paddle.static.data("y", [rows, 1], "int64")
            loss = models.loss("convbn", x, y, parts)
            optimizer = fleet.distributed_optimizer(make_optimizer(strategy), strategy)
            _, params_grads = optimizer.minimize(loss)
    except StrategyConflictError as error:
        return {"conflict": str(error)}
    except CompileError as error:
        return {"compile_error": str(error)}
    steps_per_run = strategy.execution_strategy.num_iteration_per_run
    with paddle.static.scope_guard(scope):
        paddle.seed(SEED + rank)               # ranks differ until the startup broadcast
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
        exe = optimizer.prepare_executor(paddle.static.Executor(paddle.CPUPlace()))
        losses = []
        for first in range(0, MICRO_STEPS, steps_per_run):
            steps = range(first, first + steps_per_run)
            feed = {"x": np.concatenate([x_all[s * BATCH + rank * rows:][:rows] for s in steps]),
                    "y": np.concatenate([y_all[s * BATCH + rank * rows:][:rows] for s in steps])}
            losses += np.ravel(exe.run(main, feed=feed, fetch_list=[loss])[0]).tolist()
        params = {p.name: np.array(scope.find_var(p.name).get_tensor()).ravel().tolist() for p, _ in params_grads}
    report = optimizer.compile_report
    return {"losses": losses, "params": params, "applied": report.applied,
            "persistable_problems": program_state.problems(main, startup, scope),
            "skipped": {r.name: r.reason for r in report.records if r.status == "skipped"}}


def main():
    world, cases = int(sys.argv[1]), json.loads(sys.argv[2])
    paddle.enable_static()
    fleet.init(is_collective=True)
    x_all, y_all = models.digits(BATCH * MICRO_STEPS)
    defaults = paddle.get_flags(list(EXECUTOR_FLAGS))
    results = {}
    for name, fields in cases.items():
        results[name] = train(fields, world, x_all, y_all)
        paddle.set_flags(defaults)
    write_result(results)


if __name__ == "__main__":
    main()
