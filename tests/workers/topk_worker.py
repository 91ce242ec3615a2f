"""Train a digits MLP with the top-k exchange, one case after another, and hand back what the
NumPy reference needs: per step this rank's raw gradients, the reduced gradients every rank
applies, and the residuals after the step (hierarchical: this rank's share); the parameters at
the end; and how many of the program's ops are compiled MSTopK selections (one per gradient or
per bucket). Rank r of N trains on rows (N * step + r) * ROWS onwards.

Usage: topk_worker.py CASES_JSON
The raw gradients come from a second program (the same model, so the same parameter names, with
plain backward) run on the same scope and batch just before each training step: backward in the
compiled program computes exactly the same values. The model's first weight (64 x 300 = 19,200
elements) is large enough for MSTopK's sampled path; its second (3,000) takes the exact path.
"""
import sys
from pathlib import Path

import numpy as np
import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from fleetlite.compile import program_edit  # noqa: E402
from fleetlite.compression import mstopk_kernel  # noqa: E402
from fleetlite.api import _topology  # noqa: E402
from fleetlite.strategies.topk_exchange import RESIDUAL_SUFFIX  # noqa: E402
from support import case_runner, models  # noqa: E402

ROWS, STEPS, HIDDEN, LEARNING_RATE = 16, 6, 300, 0.1
TAKEN = ("linear_0.w_0", "linear_1.w_0")


def programs(fields):
    """(training program, startup, loss, {param: reduced grad}, raw-gradient program, {param: raw grad}, report)."""
    strategy = fleet.DistributedStrategy()
    for field, value in fields.items():
        setattr(strategy, field, value)
    main, startup, loss, built, plain, raw = models.with_raw_gradients(
        strategy, _topology(), lambda: paddle.optimizer.SGD(LEARNING_RATE), ROWS, HIDDEN)
    return main, startup, loss, {p.name: g for p, g in built.params_grads}, plain, raw, built.report


def train(fields, x_all, y_all):
    """`fields` is the strategy, but "poison": [rank, step] makes that rank's batch inf at that step."""
    rank, world = fleet.worker_index(), fleet.worker_num()
    poison = fields.pop("poison", None)
    main, startup, loss, reduced, plain, raw, report = programs(fields)
    paddle.set_flags(report.runtime_flags)
    names = sorted(reduced)
    fetch_reduced = "gradient_merge" not in fields   # inside gradient merge's branch they cannot be fetched
    steps = []
    with paddle.static.scope_guard(paddle.static.Scope()):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(3 + rank)                         # ranks differ until the startup broadcast
        exe.run(startup)
        scope = paddle.static.global_scope()
        initial = {n: np.array(scope.find_var(n).get_tensor()).tolist() for n in names}
        for step in range(STEPS):
            rows = slice((world * step + rank) * ROWS, (world * step + rank + 1) * ROWS)
            x = np.full_like(x_all[rows], np.inf) if poison == [rank, step] else x_all[rows]
            feed = {"x": x, "y": y_all[rows]}
            raw_values = exe.run(plain, feed=feed, fetch_list=[raw[n] for n in TAKEN])
            fetched = exe.run(main, feed=feed, fetch_list=[loss] + ([reduced[n] for n in names] if fetch_reduced else []))
            residuals = {n: np.array(scope.find_var(n + RESIDUAL_SUFFIX).get_tensor()).tolist()
                         for n in TAKEN if scope.find_var(n + RESIDUAL_SUFFIX) is not None}
            steps.append({"loss": float(fetched[0]), "raw": {n: v.tolist() for n, v in zip(TAKEN, raw_values)},
                          "reduced": {n: v.tolist() for n, v in zip(names, fetched[1:])}, "residual": residuals})
        params = {n: np.array(scope.find_var(n).get_tensor()).tolist() for n in names}
    record = report.record("topk")
    selections = {"custom_op." + name for name in (mstopk_kernel.OP_NAME, mstopk_kernel.BUCKET_SELECT,
                                                   mstopk_kernel.BUCKET_SELECT_ACCUMULATED + "_")}
    kernels = [op for op in program_edit.walk(main.global_block()) if op.name() in selections]
    return {"steps": steps, "initial": initial, "params": params, "topk": record.details,
            "applied": report.applied, "kernel_ops": len(kernels)}


if __name__ == "__main__":
    case_runner.train_each_case(train, ROWS * STEPS)
