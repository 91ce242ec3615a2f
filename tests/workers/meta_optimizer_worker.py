"""Train the digits MLP in a static program under each lars / lamb case on this rank's rows (r::N of
the global batch), and beside it, in the same process, the one-process reference on the full batch:
Paddle's own program with the optimizer Fleet's meta-optimizer builds (support.meta_optimizers),
started from the trained program's parameters after its startup broadcast. Writes each case's
losses, the reference's, the largest parameter difference and the compile report's details to
OUT/result.<rank>.json.

Usage: meta_optimizer_worker.py OUT        (under fleetlite run / fleetrun, world size dividing 16)
"""
import sys
from pathlib import Path

import numpy as np
import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from support import models  # noqa: E402
from support.rank_results import write_rank_results  # noqa: E402
from support.meta_optimizers import fleet_optimizer  # noqa: E402
from workers.knob_pairs_worker import make_strategy  # noqa: E402

BATCH, STEPS, SEED = 16, 5, 7
CASES = {   # name: (inner optimizer, strategy fields)
    "lars": (lambda: paddle.optimizer.Momentum(0.1, momentum=0.9),
             {"lars": True, "lars_configs": {"lars_coeff": 0.05, "lars_weight_decay": 0.001, "epsilon": 1e-5,
                                             "exclude_from_weight_decay": ["b_0"]}}),
    "lamb": (lambda: paddle.optimizer.Adam(0.01, beta1=0.85, beta2=0.99, epsilon=1e-6),
             {"lamb": True, "lamb_configs": {"lamb_weight_decay": 0.02,
                                             "exclude_from_weight_decay": ["linear_1.b_0"]}}),
}


def program(rows, make_optimizer):
    """(main, startup, loss, optimizer's minimize result) of the MLP on `rows` rows."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [rows, 64], "float32")
        y = paddle.static.data("y", [rows, 1], "int64")
        loss = models.loss("mlp", x, y, 1)
        optimizer = make_optimizer()
        _, params_grads = optimizer.minimize(loss)
    return main, startup, loss, optimizer, sorted(p.name for p, _ in params_grads)


def run(main, startup, loss, feeds, scope, initial=None):
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope):
        paddle.seed(SEED + fleet.worker_index())    # ranks differ until the startup broadcast
        exe.run(startup)
        for name, value in (initial or {}).items():
            scope.find_var(name).get_tensor().set(value, paddle.CPUPlace())
        return [float(exe.run(main, feed=feed, fetch_list=[loss])[0]) for feed in feeds]


def compare(name, x, y):
    make_inner, fields = CASES[name]
    rank, world = fleet.worker_index(), fleet.worker_num()
    main, startup, loss, optimizer, names = program(
        BATCH // world, lambda: fleet.distributed_optimizer(make_inner(), make_strategy(fields)))
    exe = paddle.static.Executor(paddle.CPUPlace())
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        paddle.seed(SEED + rank)
        exe.run(startup)
        initial = {n: np.array(scope.find_var(n).get_tensor()) for n in names}
        rows = [slice(step * BATCH, (step + 1) * BATCH) for step in range(STEPS)]
        losses = [float(exe.run(main, feed={"x": x[r][rank::world], "y": y[r][rank::world]}, fetch_list=[loss])[0])
                  for r in rows]
        trained = {n: np.array(scope.find_var(n).get_tensor()) for n in names}
    ref_main, ref_startup, ref_loss, _, _ = program(BATCH, lambda: fleet_optimizer(make_inner(), fields))
    ref_scope = paddle.static.Scope()
    with paddle.static.scope_guard(ref_scope):
        exe.run(ref_startup)
        for n, value in initial.items():
            ref_scope.find_var(n).get_tensor().set(value, paddle.CPUPlace())
        reference_losses = [float(exe.run(ref_main, feed={"x": x[r], "y": y[r]}, fetch_list=[ref_loss])[0])
                            for r in rows]
        expected = {n: np.array(ref_scope.find_var(n).get_tensor()) for n in names}
    report = optimizer.compile_report
    return {"losses": losses, "reference_losses": reference_losses,
            "param_diff": max(float(np.abs(trained[n] - expected[n]).max()) for n in names),
            "moved": max(float(np.abs(trained[n] - initial[n]).max()) for n in names),
            "applied": report.applied, "details": report.record(name).details,
            "update_ops": [op.name() for op in main.global_block().ops if op.name().endswith(("momentum_", "adam_",
                                                                                              "lamb_"))]}


if __name__ == "__main__":
    write_rank_results(compare, CASES, BATCH * STEPS)
