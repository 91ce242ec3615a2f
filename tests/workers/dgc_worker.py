"""Train a digits MLP with Momentum under several dgc strategies, one case after another, and hand
back what the NumPy reference needs: the parameters after startup, and per step this rank's raw
gradients and the parameters after the step (float32 arrays as base64, exact and compact).

Usage: dgc_worker.py CASES_JSON
The raw gradients come from a second program (the same model, so the same parameter names, with
plain backward) run on the same scope and batch just before each training step: backward in the
compiled program computes exactly the same values. The model's first weight (64 x 300 = 19,200
elements) is the one gradient DGC takes (>= 16,384); the others go dense.
"""
import base64
import sys
from pathlib import Path

import numpy as np
import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from fleetlite.api import _topology  # noqa: E402
from support import case_runner, models  # noqa: E402

ROWS, STEPS, HIDDEN, LEARNING_RATE, MOMENTUM = 16, 7, 300, 0.1, 0.9


def encoded(array):
    return base64.b64encode(np.ascontiguousarray(array, dtype=np.float32).tobytes()).decode()


def programs(fields):
    """(training program, startup, loss, parameter names, raw-gradient program, {param: raw grad}, report)."""
    strategy = fleet.DistributedStrategy()
    for field, value in fields.items():
        setattr(strategy, field, value)
    main, startup, loss, built, plain, raw = models.with_raw_gradients(
        strategy, _topology(), lambda: paddle.optimizer.Momentum(LEARNING_RATE, momentum=MOMENTUM), ROWS, HIDDEN)
    return main, startup, loss, sorted(p.name for p, _ in built.params_grads), plain, raw, built.report


def train(fields, x_all, y_all):
    rank = fleet.worker_index()
    main, startup, loss, names, plain, raw, report = programs(fields)
    paddle.set_flags(report.runtime_flags)
    steps = []
    with paddle.static.scope_guard(paddle.static.Scope()):
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.seed(3 + rank)                         # ranks differ until the startup broadcast
        exe.run(startup)
        scope = paddle.static.global_scope()
        read = lambda: {n: encoded(np.array(scope.find_var(n).get_tensor())) for n in names}  # noqa: E731
        initial = read()
        for step in range(STEPS):
            rows = slice((2 * step + rank) * ROWS, (2 * step + rank + 1) * ROWS)
            feed = {"x": x_all[rows], "y": y_all[rows]}
            raw_values = exe.run(plain, feed=feed, fetch_list=[raw[n] for n in names])
            exe.run(main, feed=feed, fetch_list=[loss])
            steps.append({"raw": {n: encoded(v) for n, v in zip(names, raw_values)}, "params": read()})
    return {"initial": initial, "steps": steps, "applied": report.applied, "dgc": report.record("dgc").details}


if __name__ == "__main__":
    case_runner.train_each_case(train, ROWS * STEPS)
